"""``compress_pool()``: heads and FFN neurons under one budget, then compensation judged on held-out data.

Stages (each recorded; the summary says which were kept):

1. *score*: per-example mask gradients of every head and neuron in one backward per batch
   (``scores="fisher"``, :func:`headprune.scoring.units.unit_fisher`), or FLAP's fluctuation of their inputs
   from one forward, no labels (:mod:`headprune.scoring.fluctuation`: ``scores="fluctuation"`` standardised per
   kind over all layers and ranked together as FLAP does; ``"fluctuation-raw"`` not standardised, the expected
   squared output change of holding each unit at its mean, traded against price), on the calibration batches;
2. *select*: one global budget over the pool (``units``: heads, neurons or both), priced in FLOPs at
   ``seq_len``, parameters, or measured seconds (:mod:`headprune.selection.units`);
3. *bias* (``compensate="bias"`` or ``"bias+reconstruct"``): every removed unit's input held at its calibration
   mean, folded into its output projection's bias (:mod:`headprune.core.biases`; one added where there is none):
   exact mean replacement, so it is not guarded (FLAP's bias compensation);
4. *remove*: physical surgery of heads and neurons (exactly what masking them computes);
5. *reconstruct* (``compensate="reconstruct"`` or ``"bias+reconstruct"``, the bias then refitted too): least-squares refit of every output / down projection
   (:mod:`.reconstruct`) on the calibration batches -- or on ``fit_batches``, more examples than the
   scores need: the refit uses no labels, and with ``k x d_out`` numbers per projection it overfits a
   few thousand tokens (on the SST-2 MiniLM classifier at 60% of FLOPs, 4096 phrases instead of 512
   cut the KL divergence from the unpruned model by a third on held-out sentences,
   ``benchmarks/fit_size.py``) -- kept only if it lowers the mean loss on the
   *validation* batches, which neither the scores nor the fit saw (``val_batches``; else ``val_share`` of the
   calibration batches, spread over their order, are held out for it). With three disjoint sets --
   calibration, validation, and the test data the result is reported on -- the guard cannot hide a
   fit that only helps the examples it was fitted to.
6. *distill* (``distill_epochs`` > 0, off by default): every weight of the pruned model trained for a few
   passes over the fit batches to match the unpruned model's output distribution
   (:mod:`.distill`; no labels read), kept only if it lowers the validation loss further.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields

import torch
from torch import nn

from ..checks import check_choice, check_int, check_number, check_share
from ..core.biases import mean_shifts, shift_biases
from ..core.cost import flop_breakdown
from ..core.ffn import find_ffns
from ..core.kept import kept_neurons
from ..core.prune import prune_heads, prune_neurons
from ..core.sites import find_sites
from ..core.standins import linear_standins
from ..core.surgery import kept_heads
from ..core.unit_cost import PRICES, UnitCosts, unit_costs
from ..core.verify import verify_surgery
from ..deprecation import deprecated
from ..errors import ConfigError
from ..scoring.fluctuation import channel_stats, fluctuation_scores, knapsack_scores
from ..scoring.gradients import LossFn, mean_loss
from ..scoring.units import unit_fisher
from ..selection.aligned import select_aligned
from ..selection.gqa import GQA_MODES, kv_groups
from ..selection.units import UNITS, select_units
from .distill import distill
from .reconstruct import reconstruct
from .tuning import TARGETS

COMPENSATIONS = ("none", "reconstruct", "bias", "bias+reconstruct", "linear", "linear+reconstruct")
SCORES = ("fisher", "fluctuation", "fluctuation-raw")


@dataclass
class UnitSettings:
    """One budget over heads and/or neurons and how to compensate (validated on creation)."""

    share: float = 0.5  # share of the pool's price kept, 0..1
    units: str = "both"  # heads | neurons | both
    price: str = "flops"  # flops (at seq_len / tgt_len) | params | latency (needs prices=)
    seq_len: int = 128
    tgt_len: int | None = None
    compensate: str = "reconstruct"  # none | reconstruct | bias (removed units held at their mean) | linear (their
    # best affine prediction from the kept units, core.standins) | bias+reconstruct | linear+reconstruct
    scores: str = "fisher"  # fisher (mask gradients, labelled) | fluctuation (FLAP: one forward, no labels) |
    # fluctuation-raw (the same, not standardised per kind)
    damping: float = 1e-2  # ridge of the refit towards the pruned weights, relative to the mean input power
    target: str = "residual"  # what each layer reproduces: the residual stream after it, or its output
    val_share: float = 0.25  # without val_batches: share of the calibration batches held out (spread) for the guard
    guard: bool = True  # keep the reconstruction only where it lowers the validation loss
    gqa: str = "uniform"  # grouped-query attention: uniform | groups | free (see headprune.selection.gqa)
    min_per_site: int = 0  # every site keeps at least this many heads (paid from the budget first)
    distill_epochs: int = 0  # passes of distillation over the fit batches after the refit (0: none)
    distill_lr: float = 2e-5  # its peak learning rate (AdamW, linear decay to 0; benchmarks/distill_selection.py)
    seed: int = 0  # order of the distillation batches
    multiple_of: int = 1  # every changed FFN / attention width a multiple of this (1: any width; selection.aligned)

    def __post_init__(self):
        check_share("share", self.share)
        check_choice("units", self.units, UNITS)
        check_choice("price", self.price, (*PRICES, "latency"))
        check_int("seq_len", self.seq_len, 1)
        check_int("tgt_len", self.tgt_len, 1, optional=True)
        check_choice("compensate", self.compensate, COMPENSATIONS)
        check_choice("scores", self.scores, SCORES)
        check_number("damping", self.damping, low=0)
        check_choice("target", self.target, TARGETS)
        check_share("val_share", self.val_share, one=False)
        check_int("min_per_site", self.min_per_site, 0)
        check_choice("gqa", self.gqa, GQA_MODES)
        check_int("distill_epochs", self.distill_epochs, 0)
        check_number("distill_lr", self.distill_lr, low=0, strict=True)
        check_int("seed", self.seed, 0)
        check_int("multiple_of", self.multiple_of, 1)


@dataclass
class UnitResult:
    """The compressed ``model`` and what was done to it (JSON-ready through :meth:`to_dict`)."""

    model: nn.Module
    settings: dict
    dropped_heads: dict[str, list[int]]
    dropped_neurons: dict[str, list[int]]
    kept_heads: dict[str, list[int]]
    kept_neurons: dict[str, list[int]]
    selection: dict
    sizes: dict[str, dict]
    stages: dict[str, str]  # stage -> "kept" | "rejected (...)" | "skipped"
    val_loss: dict[str, float] = field(default_factory=dict)
    reconstruction: list[dict] = field(default_factory=list)
    distillation: dict = field(default_factory=dict)  # steps, seconds, lr, first and last training loss
    split: dict[str, int] = field(default_factory=dict)  # calibration / validation batches and examples
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name != "model"}
        return out | {"model_class": type(self.model).__name__}

    def summary(self) -> str:
        """One line: what was kept, and which stages were kept or turned down."""
        b, a = self.sizes["before"], self.sizes["after"]
        stages = ", ".join(f"{k} {v}" for k, v in self.stages.items())
        return (f"kept {a['heads']}/{b['heads']} heads, {a['neurons']}/{b['neurons']} neurons, "
                f"{a['flops'] / b['flops']:.1%} of FLOPs, {a['params'] / b['params']:.1%} of parameters; "
                f"stages: {stages}")


def compress_units(model: nn.Module, calib_batches: Iterable[Mapping[str, torch.Tensor]],
                   settings: UnitSettings | None = None, *, val_batches=None, fit_batches=None,
                   prices: UnitCosts | None = None, loss_fn: LossFn | None = None, verify: bool = True,
                   progress: bool = False, **overrides) -> UnitResult:
    """Deprecated: :func:`headprune.compression.compress` with :class:`~.settings.PruneSettings` (``units``,
    ``share``, ``price``, ``compensate``: the same names). Keyword ``overrides`` build the settings."""
    deprecated("compress_units(model, batches, UnitSettings(...))",
               "compress(model, batches, PruneSettings(units=..., share=..., price=..., compensate=...))")
    if settings is not None and (overrides or not isinstance(settings, UnitSettings)):
        raise ConfigError(f"settings: give a UnitSettings or keyword settings ({', '.join(overrides)}), not both")
    return compress_pool(model, calib_batches, settings or UnitSettings(**overrides), val_batches=val_batches,
                         fit_batches=fit_batches, prices=prices, loss_fn=loss_fn, verify=verify, progress=progress)


def compress_pool(
    model: nn.Module,
    calib_batches: Iterable[Mapping[str, torch.Tensor]],
    settings: UnitSettings,
    *,
    val_batches: Iterable[Mapping[str, torch.Tensor]] | None = None,
    fit_batches: Iterable[Mapping[str, torch.Tensor]] | None = None,
    prices: UnitCosts | None = None,
    loss_fn: LossFn | None = None,
    verify: bool = True,
    progress: bool = False,
) -> UnitResult:
    """The pipeline of :func:`headprune.compression.compress` for heads and/or FFN neurons under one budget
    (see the module doc): prune a copy of ``model``.

    ``calib_batches``: labelled inputs for scores and the refit; ``val_batches``: labelled inputs for the
    guard, disjoint from both the calibration data and whatever the result is evaluated on.
    ``fit_batches``: inputs for the reconstruction (labels unused; default: ``calib_batches``); they may
    include the calibration examples but not the validation ones, so they need ``val_batches``.
    ``prices``: per-unit prices (e.g. measured seconds, :func:`headprune.bench.unit_latency.latency_prices`);
    required for ``price="latency"``.
    """
    if not isinstance(settings, UnitSettings):
        raise ConfigError(f"settings: {type(settings).__name__}; allowed: UnitSettings")
    if settings.price == "latency" and prices is None:
        raise ConfigError("price='latency' needs prices= (a latency table measured on the target machine)")
    batches = list(calib_batches)
    if not batches:
        raise ConfigError("calib_batches: empty; compression needs calibration examples")
    if settings.units != "heads" and not find_ffns(model):
        raise ConfigError(f"units={settings.units!r}: {type(model).__name__} has no feed-forward block headprune "
                          "can find; allowed: units='heads'")
    calib, val = _split(batches, val_batches, settings)
    fit = calib
    if fit_batches is not None:
        fit = list(fit_batches)
        if not fit:
            raise ConfigError("fit_batches: empty; allowed: inputs for the reconstruction, or None (the calibration "
                              "batches)")
        if val_batches is None and _guarded(settings):
            raise ConfigError("fit_batches without val_batches: the guard's validation part would be held out of the "
                              "calibration batches, which fit_batches may contain; allowed: pass val_batches too")
    if verify:
        verify_surgery(model)
    start = time.perf_counter()
    seconds = {}
    before = sizes(model, settings)
    costs = prices if prices is not None else unit_costs(model, settings.price, seq_len=settings.seq_len,
                                                          tgt_len=settings.tgt_len)
    head_scores, neuron_scores, stats = _scores(model, calib, settings, costs, loss_fn, progress)
    seconds["score"] = time.perf_counter() - start
    if settings.multiple_of > 1:  # every changed width a multiple of the block (selection.aligned)
        drop_h, drop_n, selection = select_aligned(
            head_scores, neuron_scores, costs, settings.share, multiple_of=settings.multiple_of,
            head_dims={s.name: s.head_dim for s in find_sites(model)}, units=settings.units, groups=kv_groups(model),
            gqa=settings.gqa, min_per_site=settings.min_per_site)
    else:
        drop_h, drop_n, selection = select_units(head_scores, neuron_scores, costs, settings.share,
                                                 units=settings.units, groups=kv_groups(model), gqa=settings.gqa,
                                                 min_per_site=settings.min_per_site)
    t = time.perf_counter()
    pruned = copy.deepcopy(model)
    stages = {"select": "kept"}
    standin = settings.compensate.split("+")[0]
    if standin in ("bias", "linear") and (any(drop_h.values()) or any(drop_n.values())):
        if stats is None or (standin == "linear" and stats.second is None):  # before the cut, which keeps biases
            stats = channel_stats(model, calib, heads=any(drop_h.values()), neurons=any(drop_n.values()),
                                  gram=standin == "linear", progress=progress)
        if standin == "bias":
            shift_biases(pruned, mean_shifts(model, stats.mean, drop_h, drop_n))
            stages["bias"] = "kept (unguarded: removed units held at their calibration means)"
        else:
            linear_standins(pruned, stats.mean, stats.second, drop_h, drop_n, damping=settings.damping)
            stages["linear"] = ("kept (unguarded: removed units replaced by their least-squares affine prediction "
                                "from the kept ones on the calibration tokens)")
    prune_heads(pruned, {k: v for k, v in drop_h.items() if v}, verify=False)  # verified above (or trusted)
    if any(drop_n.values()):
        prune_neurons(pruned, {k: v for k, v in drop_n.items() if v}, verify=verify)  # its own trial
    pruned.eval()
    seconds["select+remove"] = time.perf_counter() - t
    stages["remove"] = "kept"
    val_loss, rows, distilled = {}, [], {}

    def loss(key: str, m: nn.Module) -> float:  # the validation loss of ``m``, measured once per key
        if key not in val_loss:
            val_loss[key] = mean_loss(m, val, loss_fn=loss_fn)
        return val_loss[key]

    def keep_if_better(key: str, candidate: nn.Module, current_key: str, current: nn.Module):
        if not settings.guard:
            return candidate, key, "kept (unguarded)"
        loss("unpruned", model)
        old, new = loss(current_key, current), loss(key, candidate)
        if new <= old:
            return candidate, key, "kept"
        return current, current_key, f"rejected (validation loss {new:.4f} > {old:.4f} without it)"

    current_key = "pruned"
    stages["reconstruct"] = "skipped"
    if settings.compensate.endswith("reconstruct"):
        t = time.perf_counter()
        candidate = copy.deepcopy(pruned)
        rows = reconstruct(candidate, model, fit, damping=settings.damping, target=settings.target,
                           progress=progress)
        seconds["reconstruct"] = time.perf_counter() - t
        pruned, current_key, stages["reconstruct"] = keep_if_better("reconstructed", candidate, current_key, pruned)
    if settings.distill_epochs:
        t = time.perf_counter()
        candidate = copy.deepcopy(pruned)
        info = distill(candidate, model, fit, epochs=settings.distill_epochs, lr=settings.distill_lr,
                       seed=settings.seed, progress=progress)
        distilled = {k: v for k, v in info.items() if k != "losses"} | {"loss_first": info["losses"][0],
                                                                        "loss_last": info["losses"][-1]}
        seconds["distill"] = time.perf_counter() - t
        pruned, current_key, stages["distill"] = keep_if_better("distilled", candidate, current_key, pruned)
    seconds["total"] = time.perf_counter() - start
    after = sizes(pruned, settings)
    return UnitResult(model=pruned, settings=asdict(settings), dropped_heads=drop_h, dropped_neurons=drop_n,
                      kept_heads=kept_heads(pruned), kept_neurons=kept_neurons(pruned) if find_ffns(pruned, skip_moe=True) else {}, selection=selection,
                      sizes={"before": before, "after": after}, stages=stages, val_loss=val_loss,
                      reconstruction=rows, distillation=distilled, seconds=seconds,
                      split={"calib_batches": len(calib), "val_batches": len(val),
                             "calib_examples": _examples(calib), "val_examples": _examples(val),
                             "fit_batches": len(fit), "fit_examples": _examples(fit)})


def _scores(model: nn.Module, calib: list, settings: UnitSettings, costs: UnitCosts, loss_fn, progress: bool):
    """(head scores, neuron scores, channel statistics or None) for the one-budget search: Fisher diagonals,
    FLAP's standardised fluctuation made knapsack values (:func:`~headprune.scoring.fluctuation.knapsack_scores`),
    or the raw fluctuation (an additive score, like the Fisher's)."""
    heads, neurons = settings.units != "neurons", settings.units != "heads"
    if settings.scores == "fisher":
        fisher = unit_fisher(model, calib, loss_fn=loss_fn, heads=heads, neurons=neurons, progress=progress)
        return fisher.heads, fisher.neurons, None
    found = fluctuation_scores(model, calib, heads=heads, neurons=neurons, gram=settings.compensate.startswith("linear"),
                               progress=progress)
    if settings.scores == "fluctuation-raw":  # additive (squared output change), per price like the Fisher
        return {k: found.raw[k] for k in found.heads}, {k: found.raw[k] for k in found.neurons}, found.stats
    floor = min(float(v.min()) for v in (*found.heads.values(), *found.neurons.values()))
    return (knapsack_scores(found.heads, costs.heads, floor), knapsack_scores(found.neurons, costs.neurons, floor),
            found.stats)


def _split(batches: list, val_batches, settings: UnitSettings) -> tuple[list, list]:
    """(calibration, validation) batches: ``val_batches`` as given, else the last share held out."""
    if val_batches is not None:
        val = list(val_batches)
        if not val:
            raise ConfigError("val_batches: empty; allowed: labelled batches disjoint from the calibration data")
        return batches, val
    if not _guarded(settings):
        return batches, []
    if len(batches) < 2:
        raise ConfigError(f"calibration has {len(batches)} batch; holding out a validation part needs >= 2 batches "
                          "(or pass val_batches)")
    n = len(batches)
    n_val = min(n - 1, max(1, math.ceil(settings.val_share * n)))
    held = held_out(n, n_val)
    return [b for i, b in enumerate(batches) if i not in held], [batches[i] for i in sorted(held)]


def _guarded(settings: UnitSettings) -> bool:
    """Whether a compensation stage runs and is judged on validation data."""
    return settings.guard and (settings.compensate.endswith("reconstruct") or settings.distill_epochs > 0)


def held_out(n: int, n_val: int) -> set[int]:
    """``n_val`` of ``n`` batch positions spread evenly over the order (evaluators yield batches sorted by
    length, so the last ones would be the shortest examples only)."""
    return {min(n - 1, int((i + 0.5) * n / n_val)) for i in range(n_val)}


def _examples(batches: list) -> int:
    return sum(int(next(iter(b.values())).shape[0]) for b in batches)


def sizes(model: nn.Module, settings: UnitSettings) -> dict:
    flops = flop_breakdown(model, settings.seq_len, tgt_len=settings.tgt_len)
    return {"heads": sum(s.num_heads for s in find_sites(model)), "neurons": sum(f.width for f in find_ffns(model, skip_moe=True)),
            "params": sum(p.numel() for p in model.parameters()), "flops": flops["total"],
            "seq_len": settings.seq_len, "tgt_len": settings.tgt_len}
