"""``rearrange``: after selection, per-site swaps of kept and dropped heads that lower the Fisher block's loss
estimate (Kwon et al. 2022; :func:`headprune.selection.rearrange.rearrange`), guarded on the calibration loss.
A stage of the head plan (:func:`headprune.compression.plan.plan_heads`); needs ``scores="fisher"``."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import ClassVar

from ...selection.rearrange import rearrange


@dataclass(frozen=True)
class Rearrange:
    """No settings: the swaps are exact on the Fisher estimate."""

    name: ClassVar[str] = "rearrange"
    stage: ClassVar[str] = "plan"

    def refine(self, ctx, plan):
        """The plan with the swaps (key ``rearranged``) if the guard keeps them, else ``plan``."""
        start = time.perf_counter()
        fisher = ctx.fisher
        moved = rearrange(plan.drop, fisher, groups=ctx.groups, within_groups=ctx.within_groups)
        plan.loss_estimate["rearranged"] = fisher.loss_increase(moved) / fisher.n
        plan.seconds["rearrange"] = time.perf_counter() - start
        ctx.rearranged = True
        return ctx.keep(self.name, "rearranged", plan, replace(plan, drop=moved))
