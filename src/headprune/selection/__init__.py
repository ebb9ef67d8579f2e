"""Scores -> the heads to drop: lowest-k, budgets (heads, FLOPs), Fisher rearrangement.

Plain tensors in ({site: [H] scores}), :data:`~headprune.core.surgery.DroppedHeads` out."""

from .budget import select_heads
from .lowest import lowest_heads
from .rearrange import rearrange, rearrange_site

__all__ = ["select_heads", "lowest_heads", "rearrange", "rearrange_site"]

from .units import select_units  # noqa: E402  (one budget over heads and FFN neurons)

__all__ += ["select_units"]
