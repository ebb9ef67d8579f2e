"""``compress(model, batches, PruneSettings(...))``: the one entry point of post-training compression.

Heads, FFN neurons or both, under one budget (:mod:`.settings`), in one pipeline: check, select (and refine the
selection), stand in for what goes, cut, refit, each stage through the guard (:mod:`.guard`) and written in one
stage log, returning one :class:`~.result.CompressResult`. Only the selection step differs with the settings: the
head plan (:func:`.plan.plan_heads`: GQA-aware selection of heads, rearranged and with tuned scales, guarded on
the calibration loss) or the budget over heads and neurons (:func:`.pool.select_and_cut`: one knapsack, in
``steps`` rounds, with a stand-in); the refits and distillation after the cut are guarded on validation data.
Arguments the settings cannot use are refused, not dropped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ..core.cut.surgery import kept_heads
from ..core.masks.folding import fold_scales
from ..core.model.ffn import find_ffns
from ..core.model.finite import check_finite_weights
from ..core.model.kept import kept_neurons
from ..core.model.sites import find_sites
from ..core.model.unit_cost import UnitCosts
from ..core.prune import prune_heads
from ..core.safety.verify import verify_surgery
from ..errors import ConfigError
from ..scoring.gradients import LossFn
from .copies import owning, working_copy
from .fingerprint import fingerprint
from .guard import Guard
from .plan import plan_heads
from .pool import Run, check_pool_inputs, examples, refits, select_and_cut, split
from .replay import plan_of
from .result import CompressResult, sizes
from .settings import PruneSettings


def compress(
    model: nn.Module,
    calib_batches: Iterable[Mapping[str, torch.Tensor]],
    settings: PruneSettings,
    *,
    val_batches: Iterable[Mapping[str, torch.Tensor]] | None = None,
    fit_batches: Iterable[Mapping[str, torch.Tensor]] | None = None,
    prices: UnitCosts | None = None,
    sites: list[str] | None = None,
    loss_fn: LossFn | None = None,
    inplace: bool = False,
    verify: bool = True,
    progress: bool = False,
) -> CompressResult:
    """Prune ``model`` to the one budget of ``settings`` and return the smaller model with what was done.

    ``calib_batches``: labelled inputs for the scores (and tuning / the refit), disjoint from whatever the
    result is evaluated on; ``scores="fluctuation"`` / ``"fluctuation-raw"`` with ``compensate="bias"`` (or
    ``"none"``) read no labels and compute no loss (an encoder-decoder's labels still build its decoder inputs).
    ``verify=False`` skips the check that surgery is exact for the model's class. The head plan (heads only, a
    count / flops / kv budget, compensate none | rearrange | tune) also takes ``sites`` (prune only these; the
    budget is of their heads) and ``inplace``; the budget over heads and neurons takes ``val_batches`` (the
    guard's held-out data), ``fit_batches`` (inputs of the refit) and ``prices`` (per-unit prices, required for
    ``price="latency"``) -- :func:`unused_inputs` says which. A model with a NaN or inf weight is refused before
    anything runs, and NaN or inf losses or scores when they appear, before any cut
    (:class:`~headprune.errors.NonFiniteError`).
    """
    if not isinstance(settings, PruneSettings):
        raise ConfigError(f"settings={type(settings).__name__}; allowed: PruneSettings(units=..., share=... or "
                          "n_keep=..., ...)")
    check_finite_weights(model)
    given = {"val_batches": val_batches, "fit_batches": fit_batches, "prices": prices, "sites": sites,
             "inplace": inplace or None}
    unused = unused_inputs(settings, **{k: v is not None for k, v in given.items()})
    if unused:
        where = "the head plan" if settings.head_plan else \
            f"units={settings.units!r}, price={settings.price!r}, compensate={list(settings.compensation_names)}"
        raise ConfigError(f"{', '.join(unused)}: not used by {where}; allowed: leave {' and '.join(unused)} out "
                          "(PruneSettings chooses the selection: see headprune.compression.settings)")
    check_model(model, settings, sites)
    batches = list(calib_batches)
    if not batches:
        raise ConfigError("calib_batches: empty; compression needs calibration examples")
    fit_batches = None if fit_batches is None else list(fit_batches)
    check_pool_inputs(model, settings, prices, val_batches, fit_batches)
    calib, val = split(batches, val_batches, settings)
    fit = calib if fit_batches is None else fit_batches
    if verify:  # refuse a model surgery cannot prune exactly before spending the calibration time
        verify_surgery(model)
    start = time.perf_counter()
    made_on = fingerprint(model)  # before any change (``inplace``, ``low_memory`` cut ``model`` itself)
    before = sizes(model, settings)
    run = Run(model, settings, loss_fn, verify, progress,
              guard=Guard(val, "validation", loss_fn, enabled=settings.guard))
    run.guard.note("select", "kept")
    if settings.head_plan:
        pruned, drop_h, drop_n, record = _head_plan(run, calib, sites, inplace)
    else:
        pruned, drop_h, drop_n, record = select_and_cut(run, calib, prices)
    pruned, rows, distilled = refits(run, pruned, fit, val)
    run.seconds["total"] = time.perf_counter() - start
    after = sizes(pruned, settings)
    cut_in_place = inplace or settings.low_memory
    plan = plan_of(None if cut_in_place else model, pruned, drop_h, drop_n, made_on=made_on,
                   sizes={"before": before, "after": after},
                   info={"settings": settings.to_dict(), "stages": run.guard.stages})
    if not cut_in_place:  # the stages' copy shared the tensors no stage wrote with ``model``: the result owns its own
        pruned = owning(pruned, model)
    return CompressResult(model=pruned, settings=settings.to_dict(), dropped_heads=drop_h, dropped_neurons=drop_n,
                          kept_heads=kept_heads(pruned),
                          kept_neurons=kept_neurons(pruned) if find_ffns(pruned, skip_moe=True) else {},
                          sizes={"before": before, "after": after}, stages=run.guard.stages,
                          losses=run.guard.losses, guard_data=record.pop("guard_data", "validation" if run.guard.losses else ""),
                          selection=record.pop("selection", {}), reconstruction=rows, distillation=distilled,
                          split={"calib_batches": len(calib), "val_batches": len(val),
                                 "calib_examples": examples(calib), "val_examples": examples(val),
                                 "fit_batches": len(fit), "fit_examples": examples(fit)},
                          seconds=run.seconds, plan=plan, **record)


def _head_plan(run: Run, calib: list, sites: list[str] | None, inplace: bool) -> tuple[nn.Module, dict, dict, dict]:
    """(the pruned model, heads dropped, no neurons, the result's head-plan fields): the plan
    (:func:`.plan.plan_heads`, its refinements guarded on the calibration loss), its scales folded, the heads cut."""
    model, settings = run.model, run.settings
    plan = plan_heads(model, calib, settings, sites=sites, loss_fn=run.loss_fn, progress=run.progress)
    run.guard.stages.update(plan.stages)
    run.guard.losses.update(plan.losses)
    pruned = model if inplace else working_copy(model)
    start = time.perf_counter()
    scales = None
    if plan.scales is not None:
        fold_scales(pruned, plan.scales)
        gone = {name: set(heads) for name, heads in plan.drop.items()}
        scales = {name: [float(s[h]) for h in range(s.numel()) if h not in gone.get(name, ())]
                  for name, s in plan.scales.items()}
    prune_heads(pruned, plan.drop, verify=False)  # verified above (or trusted)
    pruned.eval()
    run.guard.note("remove", "kept")
    run.seconds.update({**plan.seconds, "apply": time.perf_counter() - start})
    record = {"scales": scales, "loss_estimate": plan.loss_estimate, "tuning": plan.tuning,
              "guard_data": "calibration" if plan.losses else ""}
    return pruned, plan.drop, {}, record


def unused_inputs(settings: PruneSettings, *, val_batches: bool = False, fit_batches: bool = False,
                  prices: bool = False, sites: bool = False, inplace: bool = False) -> list[str]:
    """The names of the inputs given (True) that ``settings`` cannot use: ``sites`` and ``inplace`` only the head
    plan, ``val_batches``, ``fit_batches`` and ``prices`` only the budget over heads and neurons."""
    used = ("sites", "inplace") if settings.head_plan else ("val_batches", "fit_batches", "prices")
    given = {"val_batches": val_batches, "fit_batches": fit_batches, "prices": prices, "sites": sites,
             "inplace": inplace}
    return [name for name, value in given.items() if value and name not in used]


def check_model(model: nn.Module, settings: PruneSettings, sites: list[str] | None = None) -> None:
    """Refuse a head count (``n_keep``) larger than the heads it counts, and unknown ``sites``, before any work."""
    names = {s.name: s.num_heads for s in find_sites(model)}
    if sites is not None and (unknown := [s for s in sites if s not in names]):
        raise ConfigError(f"sites: unknown {unknown}; allowed: {', '.join(names)}")
    total = sum(n for name, n in names.items() if sites is None or name in sites)
    n_keep = settings.n_keep
    if n_keep is not None and not (isinstance(n_keep, int) and 0 <= n_keep <= total):
        raise ConfigError(f"n_keep={n_keep!r}; allowed: an integer 1..{total} (the heads of {type(model).__name__}"
                          f"{' in sites' if sites is not None else ''})")
