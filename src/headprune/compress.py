"""Post-training compression under a budget: score, select, rearrange, tune, fold, remove.

Methods (Kwon et al. 2022, "A Fast Post-Training Pruning Framework for Transformers", on heads):

- ``ih``: the paper's I_h (Michel et al. 4.1, l2-normalised per site), highest kept.
- ``fisher``: the diagonal empirical Fisher of the mask, sum over examples of (dL_b/dxi_h)^2.
- ``fisher+rearrange``: then, per site, swaps that lower the Fisher block's loss estimate.
- ``fisher+tune``: then the kept heads' scales tuned per site by damped least squares and folded
  into the output projections (tuning implies rearrangement).
- ``random``: seeded random scores (a baseline).

Guard (``guard=True``): rearrangement and tuning optimise proxies (a second-order loss estimate, a
per-site reconstruction), which can disagree with the model's loss when many heads go. Each stage
is kept only if the measured mean calibration loss after it is no higher than before (one forward
pass over the calibration batches per stage); ``HeadPlan.calib_loss`` / ``rejected`` say what happened.

Budgets are global across sites and kinds (:mod:`headprune.budget`): ``keep`` (share of heads),
``n_keep`` (number of heads) or ``flops`` (share of the attention heads' FLOPs at ``seq_len``).
:func:`plan_heads` gives the plan as data (dropped heads, scales) without touching the model;
:func:`compress` applies it: folds the scales, physically removes the heads and reports sizes.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields

import torch
from torch import nn

from .budget import HeadCosts, head_costs, select_heads
from .errors import ConfigError
from .fisher import Fisher, fisher_information
from .importance import LossFn, head_importance, mean_loss
from .masking import HeadMask
from .rearrange import rearrange
from .sites import find_sites
from .surgery import kept_heads, prune_heads
from .tuning import TARGETS, fold_scales, scale_mask, tune_scales

METHODS = ("ih", "fisher", "fisher+rearrange", "fisher+tune", "random")


@dataclass
class CompressSettings:
    """One budget (exactly one of ``keep``, ``n_keep``, ``flops``) and how to meet it."""

    keep: float | None = None  # share of heads kept, 0..1
    n_keep: int | None = None  # number of heads kept
    flops: float | None = None  # share of the attention heads' FLOPs kept, 0..1 (priced at seq_len / tgt_len)
    method: str = "fisher+tune"
    min_per_site: int = 0  # keep at least this many heads in every site
    seq_len: int = 128  # tokens per example for FLOP prices (encoder / decoder-only)
    tgt_len: int | None = None  # decoder tokens of encoder-decoders (None: seq_len)
    damping: float = 1e-2  # ridge towards unit scales, relative to the mean squared head contribution
    max_scale: float = 10.0  # tuned scales outside [-max_scale, max_scale] are refused (unit scales kept)
    target: str = "residual"  # what tuning reproduces: the residual stream after each site, or its "output"
    guard: bool = True  # keep rearrangement / tuning only where they lower the calibration loss
    seed: int = 0  # of the random method

    def __post_init__(self):
        given = {k: v for k, v in (("keep", self.keep), ("n_keep", self.n_keep), ("flops", self.flops)) if v is not None}
        if len(given) != 1:
            raise ConfigError(f"give exactly one budget: keep (share of heads), n_keep (number of heads) or flops "
                              f"(share of head FLOPs); got {given or 'none'}")
        for name in ("keep", "flops"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0.0 <= value <= 1.0):
                raise ConfigError(f"{name}={value!r}; allowed: a share 0.0..1.0")
        if self.n_keep is not None and (isinstance(self.n_keep, bool) or not isinstance(self.n_keep, int)
                                        or self.n_keep < 0):
            raise ConfigError(f"n_keep={self.n_keep!r}; allowed: an integer >= 0")
        if self.method not in METHODS:
            raise ConfigError(f"method={self.method!r}; allowed: {', '.join(METHODS)}")
        if isinstance(self.min_per_site, bool) or not isinstance(self.min_per_site, int) or self.min_per_site < 0:
            raise ConfigError(f"min_per_site={self.min_per_site!r}; allowed: an integer >= 0")
        for name in ("seq_len", "tgt_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}={value!r}; allowed: an integer >= 1")
        if isinstance(self.damping, bool) or not isinstance(self.damping, (int, float)) or not 0 <= self.damping < 1e30:
            raise ConfigError(f"damping={self.damping!r}; allowed: a finite number >= 0")
        if isinstance(self.max_scale, bool) or not isinstance(self.max_scale, (int, float)) or not self.max_scale > 0:
            raise ConfigError(f"max_scale={self.max_scale!r}; allowed: a number > 0")
        if self.target not in TARGETS:
            raise ConfigError(f"target={self.target!r}; allowed: {', '.join(TARGETS)}")
        if not isinstance(self.guard, bool):
            raise ConfigError(f"guard={self.guard!r}; allowed: True or False")

    @property
    def rearranges(self) -> bool:
        return self.method in ("fisher+rearrange", "fisher+tune")

    @property
    def tunes(self) -> bool:
        return self.method == "fisher+tune"


@dataclass
class Scores:
    """Head scores of one method on one calibration set (reusable across budgets)."""

    method: str
    scores: dict[str, torch.Tensor]  # {site: [H]}, higher = keep
    fisher: Fisher | None = None  # for rearrangement and the loss estimate
    seconds: float = 0.0


@dataclass
class HeadPlan:
    """What to do to the model: ``drop`` ({site: heads removed}), ``scales`` ({site: [H]} tuned mask
    values, or None), the Fisher loss estimate before / after rearrangement, tuning per site, the
    measured mean calibration loss after each stage and the stages the guard turned down."""

    drop: dict[str, list[int]]
    scales: dict[str, torch.Tensor] | None = None
    loss_estimate: dict[str, float] = field(default_factory=dict)
    tuning: list[dict] = field(default_factory=list)
    calib_loss: dict[str, float] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def mask(self, model: nn.Module) -> HeadMask:
        """The plan as a head mask (dropped heads 0, kept heads their scale): what the compressed model computes."""
        return scale_mask(model, self.drop, self.scales)


def score_heads(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], method: str, *,
                loss_fn: LossFn | None = None, seed: int = 0, progress: bool = False) -> Scores:
    """Scores for ``method`` over calibration ``batches`` (I_h, Fisher, or seeded random)."""
    if method not in METHODS:
        raise ConfigError(f"method={method!r}; allowed: {', '.join(METHODS)}")
    start = time.perf_counter()
    if method == "ih":
        scores, fisher = head_importance(model, batches, loss_fn=loss_fn, progress=progress), None
    elif method == "random":
        g = torch.Generator().manual_seed(seed)
        scores, fisher = {s.name: torch.rand(s.num_heads, generator=g, dtype=torch.float64)
                          for s in find_sites(model)}, None
    else:
        fisher = fisher_information(model, batches, loss_fn=loss_fn, progress=progress)
        scores = dict(fisher.diag)
    return Scores(method, scores, fisher, time.perf_counter() - start)


def plan_heads(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], settings: CompressSettings, *,
               scored: Scores | None = None, costs: HeadCosts | None = None,
               sites: list[str] | None = None, loss_fn: LossFn | None = None, progress: bool = False) -> HeadPlan:
    """The heads to drop and the kept heads' scales under ``settings``; ``model`` is not changed.

    ``scored``/``costs`` reuse scores (:func:`score_heads`) and prices (:func:`headprune.budget.head_costs`)
    computed before, e.g. for several budgets on one model. ``sites``: prune only these sites (the
    budget is then a share / count of their heads or FLOPs); the others keep every head.
    """
    batches = list(batches)
    family = "fisher" if settings.method.startswith("fisher") else settings.method
    if scored is None:
        scored = score_heads(model, batches, family, loss_fn=loss_fn, seed=settings.seed, progress=progress)
    elif scored.method != family:
        raise ConfigError(f"scored: scores of method {scored.method!r}; method {settings.method!r} needs {family!r}")
    seconds = {"score": scored.seconds}
    start = time.perf_counter()
    if settings.flops is not None and costs is None:
        costs = head_costs(model, settings.seq_len, tgt_len=settings.tgt_len)
    drop = select_heads(scored.scores, keep=settings.keep, n_keep=settings.n_keep, flops=settings.flops,
                        costs=costs, min_per_site=settings.min_per_site, sites=sites)
    plan = HeadPlan(drop=drop, seconds=seconds)
    if scored.fisher is not None:
        plan.loss_estimate["selected"] = scored.fisher.loss_increase(drop) / scored.fisher.n
    seconds["select"] = time.perf_counter() - start
    guarded = settings.guard and (settings.rearranges or settings.tunes) and bool(drop)
    if guarded:
        start = time.perf_counter()
        plan.calib_loss["selected"] = mean_loss(model, batches, mask=plan.mask(model), loss_fn=loss_fn)
        seconds["guard"] = time.perf_counter() - start
    if settings.rearranges:
        start = time.perf_counter()
        groups = costs.group if settings.flops is not None else None  # a FLOP budget: no key/value head more
        moved = rearrange(drop, scored.fisher, groups=groups)
        plan.loss_estimate["rearranged"] = scored.fisher.loss_increase(moved) / scored.fisher.n
        seconds["rearrange"] = time.perf_counter() - start
        plan.drop = _guarded(plan, "rearranged", HeadPlan(drop=moved), model, batches, loss_fn, guarded, seconds).drop
    if settings.tunes and plan.drop:  # nothing dropped: the unit scales are the exact answer
        start = time.perf_counter()
        tuned = tune_scales(model, batches, plan.drop, damping=settings.damping, max_scale=settings.max_scale,
                            target=settings.target, progress=progress)
        plan.tuning = tuned.sites
        seconds["tune"] = time.perf_counter() - start
        plan.scales = _guarded(plan, "tuned", HeadPlan(drop=plan.drop, scales=tuned.scales), model, batches, loss_fn,
                               guarded, seconds).scales
    return plan


def _guarded(plan: HeadPlan, stage: str, candidate: HeadPlan, model, batches, loss_fn, guarded: bool,
             seconds: dict) -> HeadPlan:
    """``candidate`` (the plan after ``stage``) unless the guard measures a higher calibration loss
    than the plan so far; then the plan so far, with the stage noted in ``plan.rejected``."""
    if not guarded or (candidate.drop == plan.drop and candidate.scales is None):
        return candidate
    start = time.perf_counter()
    loss = mean_loss(model, batches, mask=candidate.mask(model), loss_fn=loss_fn)
    seconds["guard"] += time.perf_counter() - start
    current = min(plan.calib_loss.values())  # the stages kept so far only ever lowered it
    plan.calib_loss[stage] = loss
    if loss > current:
        plan.rejected.append(stage)
        return plan
    return candidate


@dataclass
class CompressResult:
    """The compressed ``model`` and what was done to it (JSON-ready through :meth:`to_dict`)."""

    model: nn.Module
    settings: dict
    dropped: dict[str, list[int]]  # {site: heads removed, indices among the heads it had}
    kept: dict[str, list[int]]  # {site: original indices of the heads it keeps} (the saved plan)
    scales: dict[str, list[float]] | None  # tuned mask values folded into the weights (kept heads only)
    sizes: dict[str, dict]  # before / after: heads, params, flops, attention_flops
    loss_estimate: dict[str, float]
    tuning: list[dict]
    calib_loss: dict[str, float]  # measured mean calibration loss after each stage (the guard's)
    rejected: list[str]  # stages the guard turned down
    seconds: dict[str, float]

    def to_dict(self) -> dict:
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name != "model"}
        return out | {"model_class": type(self.model).__name__}


def compress(
    model: nn.Module,
    calib_batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    keep: float | None = None,
    n_keep: int | None = None,
    flops: float | None = None,
    method: str = "fisher+tune",
    min_per_site: int = 0,
    seq_len: int = 128,
    tgt_len: int | None = None,
    damping: float = 1e-2,
    max_scale: float = 10.0,
    target: str = "residual",
    guard: bool = True,
    seed: int = 0,
    sites: list[str] | None = None,
    loss_fn: LossFn | None = None,
    inplace: bool = False,
    progress: bool = False,
) -> CompressResult:
    """Prune ``model`` (a copy unless ``inplace``) to one budget with ``method``; see the module doc.

    ``calib_batches``: labelled model inputs (as for :func:`headprune.head_importance`), disjoint
    from whatever the result is evaluated on. ``sites``: prune only these (the budget is of their
    heads). Returns the physically pruned model (tuned scales folded in: it computes exactly what
    the plan's mask computes) with sizes before and after.
    """
    settings = CompressSettings(keep=keep, n_keep=n_keep, flops=flops, method=method, min_per_site=min_per_site,
                                seq_len=seq_len, tgt_len=tgt_len, damping=damping, max_scale=max_scale,
                                target=target, guard=guard, seed=seed)
    batches = list(calib_batches)
    if not batches:
        raise ConfigError("calib_batches: empty; compression needs calibration examples")
    start = time.perf_counter()
    before = _sizes(model, settings)
    plan = plan_heads(model, batches, settings, sites=sites, loss_fn=loss_fn, progress=progress)
    pruned = model if inplace else copy.deepcopy(model)
    apply_start = time.perf_counter()
    scales = None
    if plan.scales is not None:
        fold_scales(pruned, plan.scales)
        scales = {name: [float(s[h]) for h in range(s.numel()) if h not in set(plan.drop.get(name, []))]
                  for name, s in plan.scales.items()}
    prune_heads(pruned, plan.drop)
    pruned.eval()
    seconds = {**plan.seconds, "apply": time.perf_counter() - apply_start}
    after = _sizes(pruned, settings)
    seconds["total"] = time.perf_counter() - start
    return CompressResult(model=pruned, settings=asdict(settings), dropped=plan.drop, kept=kept_heads(pruned),
                          scales=scales, sizes={"before": before, "after": after},
                          loss_estimate=plan.loss_estimate, tuning=plan.tuning, calib_loss=plan.calib_loss,
                          rejected=plan.rejected, seconds=seconds)


def _sizes(model: nn.Module, settings: CompressSettings) -> dict:
    from .bench import flop_breakdown

    flops = flop_breakdown(model, settings.seq_len, tgt_len=settings.tgt_len)
    return {"heads": sum(s.num_heads for s in find_sites(model)), "params": sum(p.numel() for p in model.parameters()),
            "flops": flops["total"], "attention_flops": flops["projections"] + flops["attention"],
            "seq_len": settings.seq_len, "tgt_len": settings.tgt_len}
