"""``compress(model, batches, PruneSettings(...))``: the one entry point of post-training compression.

Heads, FFN neurons or both, under one budget (:mod:`.settings`): the settings choose the pipeline --
the head plan (:func:`.heads.compress_heads`: scores, GQA-aware selection, rearrangement, tuned scales,
guarded on the calibration loss) or the budget over heads and neurons (:func:`.pool.compress_pool`:
Fisher or fluctuation scores, one knapsack, mean-bias compensation, least-squares reconstruction and
distillation guarded on validation data).
Arguments one pipeline cannot use are refused, not dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ..core.finite import check_finite_weights
from ..core.unit_cost import UnitCosts
from ..errors import ConfigError
from ..scoring.gradients import LossFn
from .heads import CompressResult, compress_heads
from .pool import UnitResult, compress_pool
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
) -> CompressResult | UnitResult:
    """Prune ``model`` to the one budget of ``settings`` and return the smaller model with what was done.

    ``calib_batches``: labelled inputs for the scores (and tuning / the refit), disjoint from whatever the
    result is evaluated on; ``scores="fluctuation"`` / ``"fluctuation-raw"`` with ``compensate="bias"`` (or
    ``"none"``) read no labels and compute no loss (an encoder-decoder's labels still build its decoder inputs). ``verify=False`` skips the check that surgery is exact for the model's class.
    The head plan (:attr:`PruneSettings.head_plan`) returns a :class:`CompressResult` and also takes
    ``sites`` (prune only these; the budget is of their heads) and ``inplace``; the budget over heads and
    neurons returns a :class:`UnitResult` and also takes ``val_batches`` (the guard's held-out data),
    ``fit_batches`` (inputs of the refit) and ``prices`` (per-unit prices, required for ``price="latency"``).
    A model with a NaN or inf weight is refused before anything runs, and NaN or inf losses or scores when they
    appear, before any cut (:class:`~headprune.errors.NonFiniteError`).
    """
    if not isinstance(settings, PruneSettings):
        raise ConfigError(f"settings={type(settings).__name__}; allowed: PruneSettings(units=..., share=... or "
                          "n_keep=..., ...)")
    check_finite_weights(model)
    if settings.head_plan:
        _refuse("the head plan", val_batches=val_batches, fit_batches=fit_batches, prices=prices)
        return compress_heads(model, calib_batches, settings, sites=sites, loss_fn=loss_fn,
                              inplace=inplace, verify=verify, progress=progress)
    _refuse(f"units={settings.units!r}, price={settings.price!r}, compensate={list(settings.compensation_names)}",
            sites=sites, inplace=inplace or None)
    return compress_pool(model, calib_batches, settings, val_batches=val_batches,
                         fit_batches=fit_batches, prices=prices, loss_fn=loss_fn, verify=verify, progress=progress)


def _refuse(where: str, **arguments) -> None:
    given = [k for k, v in arguments.items() if v is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: not used by {where}; allowed: leave {' and '.join(given)} out "
                          "(PruneSettings chooses the pipeline: see headprune.compression.settings)")
