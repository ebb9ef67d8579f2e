"""``tune``: rearrangement, then the kept heads' scales fitted per site by damped least squares and folded into
the output projections (Kwon et al. 2022; :func:`headprune.compression.tuning.tune_scales`), each step guarded on
the calibration loss. A stage of the head plan; needs ``scores="fisher"``.

Its own settings: ``damping`` (ridge towards the unit scales, relative), ``max_scale`` (scales outside
[-max_scale, max_scale] are refused, unit scales kept) and ``target`` (what each site reproduces); None takes the
value of the :class:`~headprune.compression.PruneSettings` field of the same name (``--damping``,
``--max-scale``, ``--target``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ...checks import check_choice, check_number
from ..tuning import TARGETS, tune_scales
from .rearrange import Rearrange


@dataclass(frozen=True)
class Tune:
    name: str = "tune"
    stage: str = "plan"
    damping: float | None = None  # ridge towards the unit scales, relative (None: the settings' damping)
    max_scale: float | None = None  # refuse scales beyond +-max_scale (None: the settings' max_scale)
    target: str | None = None  # residual | output (None: the settings' target)

    def __post_init__(self):
        check_number("damping", self.damping, low=0, optional=True)
        check_number("max_scale", self.max_scale, low=0, strict=True, optional=True)
        if self.target is not None:
            check_choice("target", self.target, TARGETS)

    def refine(self, ctx, plan):
        """Rearrangement (unless a ``rearrange`` stage ran), then the tuned scales (key ``tuned``) if the guard keeps
        them. Nothing dropped: the unit scales are the exact answer, nothing is fitted."""
        if not ctx.rearranged:
            plan = Rearrange().refine(ctx, plan)
        if not plan.drop:
            return plan
        s = ctx.settings
        start = time.perf_counter()
        tuned = tune_scales(ctx.model, ctx.batches, plan.drop, damping=_own(self.damping, s.damping),
                            max_scale=_own(self.max_scale, s.max_scale), target=_own(self.target, s.target),
                            progress=ctx.progress)
        plan.tuning = tuned.sites
        plan.seconds["tune"] = time.perf_counter() - start
        return ctx.keep(self.name, "tuned", plan, replace(plan, scales=tuned.scales))


def _own(value, default):
    return default if value is None else value
