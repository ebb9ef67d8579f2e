"""What a speed benchmark runs: its settings, light to import (the CLI reads their defaults for its flags
without importing torch)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..checks import check_int
from ..errors import ConfigError

PRUNE_ORDERS = ("index", "random")  # how fraction_plan chooses the heads to remove


@dataclass(frozen=True)
class BenchSettings:
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    seq_len: int = 128
    tgt_len: int | None = None  # decoder length of encoder-decoders (None: seq_len)
    warmup: int = 1  # untimed calls per model and batch size (at least 1 when memory=True: it measures memory)
    repeats: int | Mapping[int, int] = 5  # timed rounds per batch size, or {batch size: rounds}
    min_repeat_s: float = 0.2  # forwards per round chosen so one round of the fastest model lasts this long
    alternate: bool = True  # rounds in order A B, B A, ...; False: all of A, then all of B
    memory: bool = True
    seed: int = 0  # of the random token ids

    def __post_init__(self):
        sizes = tuple(self.batch_sizes) if isinstance(self.batch_sizes, Sequence) else ()
        if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
            raise ConfigError(f"batch_sizes={self.batch_sizes!r}; allowed: a non-empty list of integers >= 1")
        object.__setattr__(self, "batch_sizes", sizes)
        check_int("seq_len", self.seq_len, 1)
        check_int("tgt_len", self.tgt_len, 1, optional=True)
        check_int("warmup", self.warmup, 0)
        reps = self.repeats if isinstance(self.repeats, Mapping) else {b: self.repeats for b in sizes}
        for b in sizes:
            check_int(f"repeats for batch size {b}", reps.get(b), 1)
        if not isinstance(self.min_repeat_s, (int, float)) or not 0 <= self.min_repeat_s < math.inf:
            raise ConfigError(f"min_repeat_s={self.min_repeat_s!r}; allowed: a finite number >= 0")

    def repeats_for(self, batch: int) -> int:
        return self.repeats[batch] if isinstance(self.repeats, Mapping) else self.repeats
