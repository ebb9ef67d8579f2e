"""Scores -> the heads to drop: one budgeted selection, the paper's lowest-k, Fisher rearrangement.

Plain tensors in ({site: [H] scores}), :data:`~headprune.core.cut.surgery.DroppedHeads` out.
:func:`select_heads` is the one entry point (every :class:`Budget`, spent as a :class:`HeadRule` says; its
default never grows a GQA model's KV cache); :func:`lowest_heads` is the paper's plain rule."""

from .budgets import Budget, HeadRule
from .gqa import kv_groups
from .lowest import lowest_heads
from .rearrange import rearrange, rearrange_site
from .select import select_heads

__all__ = ["select_heads", "Budget", "HeadRule", "kv_groups", "lowest_heads", "rearrange", "rearrange_site"]

from .units import select_units  # noqa: E402  (one budget over heads and FFN neurons)

__all__ += ["select_units"]
