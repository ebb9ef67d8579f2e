"""The per-epoch seed that orders a training epoch's batches (the batches themselves:
:func:`headprune.evaluation.batching.length_buckets` with an ``rng``)."""

from __future__ import annotations


def epoch_seed(seed: int, epoch: int) -> int:
    """One seed per (run seed, epoch): batch order and dropout of an epoch do not depend on the past."""
    return seed * 1_000_003 + epoch
