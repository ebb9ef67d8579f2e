"""``rearrange``: after selection, per-site swaps of kept and dropped heads that lower the Fisher block's loss
estimate (Kwon et al. 2022; :func:`headprune.selection.rearrange.rearrange`), guarded on the calibration loss.
A stage of the head plan (:func:`headprune.compression.plan.plan_heads`); needs ``scores="fisher"``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rearrange:
    name: str = "rearrange"
    stage: str = "plan"
    rearranges: bool = True
    tunes: bool = False
