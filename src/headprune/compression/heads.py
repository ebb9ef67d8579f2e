"""``compress_heads()``: the head plan's pipeline -- plan, then apply it -- fold the tuned scales, physically remove the heads.

The plan (:func:`.plan.plan_heads`) is data; this module turns it into a smaller plain model and
reports its sizes before and after (heads, parameters, FLOPs from :mod:`headprune.core.cost`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

import torch
from torch import nn

from ..core.folding import fold_scales
from ..core.prune import prune_heads
from ..core.sites import find_sites
from ..core.surgery import DroppedHeads, KeptHeads, kept_heads
from ..core.verify import verify_surgery
from ..errors import ConfigError
from ..scoring.gradients import LossFn
from .fingerprint import fingerprint
from .plan import plan_heads
from .pool import sizes
from .replay import Plan, plan_of
from .settings import PruneSettings


@dataclass
class CompressResult:
    """The compressed ``model`` and what was done to it (JSON-ready through :meth:`to_dict`)."""

    model: nn.Module
    settings: dict
    dropped: DroppedHeads  # {site: heads removed, indices among the heads it had}
    kept: KeptHeads  # {site: original indices of the heads it keeps} (saved with the model)
    scales: dict[str, list[float]] | None  # tuned mask values folded into the weights (kept heads only)
    sizes: dict[str, dict]  # before / after: heads, params, flops, attention_flops
    loss_estimate: dict[str, float]
    tuning: list[dict]
    calib_loss: dict[str, float]  # measured mean calibration loss after each stage (the guard's)
    rejected: list[str]  # stages the guard turned down
    seconds: dict[str, float]
    plan: Plan | None = None  # what was removed and rewritten (plan.json + plan.safetensors; headprune apply)

    def to_dict(self) -> dict:
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in ("model", "plan")}
        return out | {"model_class": type(self.model).__name__}


def compress_heads(
    model: nn.Module,
    calib_batches: Iterable[Mapping[str, torch.Tensor]],
    settings: PruneSettings,
    *,
    sites: list[str] | None = None,
    loss_fn: LossFn | None = None,
    inplace: bool = False,
    verify: bool = True,
    progress: bool = False,
) -> CompressResult:
    """The head plan's pipeline of :func:`headprune.compression.compress`: prune ``model`` (a copy unless
    ``inplace``) to the one budget of ``settings``.

    ``calib_batches``: labelled model inputs (as for :func:`headprune.head_importance`), disjoint
    from whatever the result is evaluated on. ``sites``: prune only these (the budget is of their
    heads). ``verify=False`` skips the check that surgery is exact for the model's class
    (:mod:`headprune.core.verify`). Returns the physically pruned model (tuned scales folded in: it computes
    exactly what the plan's mask computes) with sizes before and after.
    """
    check_head_count(model, settings.n_keep, sites)
    batches = list(calib_batches)
    if not batches:
        raise ConfigError("calib_batches: empty; compression needs calibration examples")
    if verify:  # refuse a model surgery cannot prune exactly before spending the calibration time
        verify_surgery(model)
    start = time.perf_counter()
    made_on = fingerprint(model)  # before any change (``inplace`` cuts ``model`` itself)
    before = sizes(model, settings)
    plan = plan_heads(model, batches, settings, sites=sites, loss_fn=loss_fn, progress=progress)
    pruned = model if inplace else copy.deepcopy(model)
    apply_start = time.perf_counter()
    scales = None
    if plan.scales is not None:
        fold_scales(pruned, plan.scales)
        gone = {name: set(heads) for name, heads in plan.drop.items()}
        scales = {name: [float(s[h]) for h in range(s.numel()) if h not in gone.get(name, ())]
                  for name, s in plan.scales.items()}
    prune_heads(pruned, plan.drop, verify=False)  # verified above (or trusted)
    pruned.eval()
    seconds = {**plan.seconds, "apply": time.perf_counter() - apply_start}
    after = sizes(pruned, settings)
    seconds["total"] = time.perf_counter() - start
    return CompressResult(model=pruned, settings=settings.to_dict(), dropped=plan.drop, kept=kept_heads(pruned),
                          scales=scales, sizes={"before": before, "after": after},
                          loss_estimate=plan.loss_estimate, tuning=plan.tuning, calib_loss=plan.calib_loss,
                          rejected=plan.rejected, seconds=seconds,
                          plan=plan_of(None if inplace else model, pruned, plan.drop, {}, made_on=made_on,
                                       sizes={"before": before, "after": after},
                                       info={"settings": settings.to_dict(), "rejected": plan.rejected}))


def check_head_count(model: nn.Module, n_keep: int | None, sites: list[str] | None) -> None:
    """Refuse a count budget larger than the heads it counts, and unknown ``sites``, before any work."""
    names = {s.name: s.num_heads for s in find_sites(model)}
    if sites is not None and (unknown := [s for s in sites if s not in names]):
        raise ConfigError(f"sites: unknown {unknown}; allowed: {', '.join(names)}")
    total = sum(n for name, n in names.items() if sites is None or name in sites)
    if n_keep is not None and not (isinstance(n_keep, int) and 0 <= n_keep <= total):
        raise ConfigError(f"n_keep={n_keep!r}; allowed: an integer 1..{total} (the heads of {type(model).__name__}"
                          f"{' in sites' if sites is not None else ''})")
