"""Batches of example indices, bucketed by length, and the per-epoch seed that orders them."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from ..errors import ConfigError


def length_bucketed_batches(lengths: Sequence[int], *, rng: random.Random, sort_chunk: int,
                            batch_size: int | None = None, max_tokens: int | None = None) -> list[list[int]]:
    """Shuffle, sort by length inside chunks of `sort_chunk` examples, cut into batches, shuffle batches.

    Batches hold `batch_size` examples, or as many as keep n * (longest length) <= `max_tokens` (an
    example longer than `max_tokens` gets a batch of its own). Every index appears exactly once.
    """
    if (batch_size is None) == (max_tokens is None):
        raise ConfigError("set exactly one of batch_size and max_tokens, "
                          f"got batch_size={batch_size!r}, max_tokens={max_tokens!r}")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order = [i for start in range(0, len(order), sort_chunk)
             for i in sorted(order[start:start + sort_chunk], key=lambda i: lengths[i])]
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
    rng.shuffle(batches)
    return batches


def _epoch_seed(seed: int, epoch: int) -> int:
    """One seed per (run seed, epoch): batch order and dropout of an epoch do not depend on the past."""
    return seed * 1_000_003 + epoch


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:  # -> [n, longest]
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)
