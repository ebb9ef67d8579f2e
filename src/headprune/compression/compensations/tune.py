"""``tune``: rearrangement, then the kept heads' scales fitted per site by damped least squares and folded into
the output projections (Kwon et al. 2022; :func:`headprune.compression.tuning.tune_scales`), each step guarded on
the calibration loss. A stage of the head plan; needs ``scores="fisher"``.

Its settings: ``damping`` (ridge towards the unit scales, relative), ``max_scale`` (scales outside
[-max_scale, max_scale] are refused, unit scales kept) and ``target`` (what each site reproduces: the residual
stream after it, or its output projection's output); ``--damping``, ``--max-scale``, ``--target`` on the CLI."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import ClassVar

from ...checks import check_choice, check_number
from ..tuning import TARGETS, tune_scales
from .rearrange import Rearrange


@dataclass(frozen=True)
class Tune:
    name: ClassVar[str] = "tune"
    stage: ClassVar[str] = "plan"
    damping: float = 1e-2  # ridge towards the unit scales, relative
    max_scale: float = 10.0  # refuse scales beyond +-max_scale (the site keeps its unit scales)
    target: str = "residual"  # residual | output: what each site reproduces

    def __post_init__(self):
        check_number("damping", self.damping, low=0)
        check_number("max_scale", self.max_scale, low=0, strict=True)
        check_choice("target", self.target, TARGETS)

    def refine(self, ctx, plan):
        """Rearrangement (unless a ``rearrange`` stage ran), then the tuned scales (key ``tuned``) if the guard keeps
        them. Nothing dropped: the unit scales are the exact answer, nothing is fitted."""
        if not ctx.rearranged:
            plan = Rearrange().refine(ctx, plan)
        if not plan.drop:
            return plan
        start = time.perf_counter()
        tuned = tune_scales(ctx.model, ctx.batches, plan.drop, damping=self.damping, max_scale=self.max_scale,
                            target=self.target, progress=ctx.progress)
        plan.tuning = tuned.sites
        plan.seconds["tune"] = time.perf_counter() - start
        return ctx.keep(self.name, "tuned", plan, replace(plan, scales=tuned.scales))
