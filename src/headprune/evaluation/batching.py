"""Batches of example indices bucketed by length (evaluation and training alike), and padding."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence

import torch

from ..errors import ConfigError


class Batches(Iterator[Mapping[str, torch.Tensor]]):
    """An iterator of batches that knows how many it yields in all (``len``), so every pass over it
    (importance, Fisher, fluctuation, evaluation) shows its progress with a total."""

    def __init__(self, batches: Iterator[Mapping[str, torch.Tensor]], count: int):
        self._batches, self._count = batches, count

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> Mapping[str, torch.Tensor]:
        return next(self._batches)

    def __len__(self) -> int:
        return self._count


def length_buckets(lengths: Sequence[int], *, batch_size: int | None = None, max_tokens: int | None = None,
                   rng: random.Random | None = None, sort_chunk: int | None = None) -> list[list[int]]:
    """Example indices in batches of similar length, every index exactly once.

    Without ``rng`` (evaluation): sorted by length, longest first, ties by index -- deterministic.
    With ``rng`` (training): shuffled, sorted by length inside chunks of ``sort_chunk`` examples
    (all of them when None), cut into batches, and the batches shuffled. Batches hold
    ``batch_size`` examples, or as many as keep n * (longest length) <= ``max_tokens`` (an example
    longer than ``max_tokens`` gets a batch of its own).
    """
    if (batch_size is None) == (max_tokens is None):
        raise ConfigError("set exactly one of batch_size and max_tokens, "
                          f"got batch_size={batch_size!r}, max_tokens={max_tokens!r}")
    if rng is None:
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    else:
        order = list(range(len(lengths)))
        rng.shuffle(order)
        chunk = sort_chunk or max(len(order), 1)
        order = [i for start in range(0, len(order), chunk)
                 for i in sorted(order[start:start + chunk], key=lambda i: lengths[i])]
    if batch_size is not None:
        batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    else:
        batches, batch, longest = [], [], 0
        for i in order:
            if batch and (len(batch) + 1) * max(longest, lengths[i]) > max_tokens:
                batches.append(batch)
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, lengths[i])
        if batch:
            batches.append(batch)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def pad_rows(rows: list[list[int]], value: int, side: str = "right") -> torch.Tensor:
    """Lists of ids -> [len(rows), longest], padded with ``value`` on ``side``."""
    longest = max(len(r) for r in rows)
    if side == "left":
        return torch.tensor([[value] * (longest - len(r)) + r for r in rows])
    return torch.tensor([r + [value] * (longest - len(r)) for r in rows])
