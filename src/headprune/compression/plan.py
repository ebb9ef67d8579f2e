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
pass over the calibration batches per stage); ``CompressPlan.calib_loss`` / ``rejected`` say what happened.

Budgets are global across sites and kinds (:mod:`headprune.selection.budget`): ``keep`` (share of heads),
``n_keep`` (number of heads) or ``flops`` (share of the attention heads' FLOPs at ``seq_len``).
:func:`plan_heads` gives the plan as data (dropped heads, scales) without touching the model;
:func:`headprune.compression.compress.compress` applies it: folds the scales, physically removes
the heads and reports sizes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..checks import check_choice, check_int, check_number, check_share
from ..core.cost import HeadCosts, head_costs
from ..core.kvcache import kv_head_bytes
from ..core.masking import HeadMask
from ..core.sites import find_sites
from ..core.surgery import DroppedHeads
from ..errors import ConfigError
from ..scoring.fisher import Fisher, fisher_information
from ..scoring.gradients import LossFn, mean_loss
from ..scoring.importance import head_importance
from ..selection.gqa import GQA_MODES, kv_groups, select_gqa
from ..selection.rearrange import rearrange
from .tuning import TARGETS, scale_mask, tune_scales

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
    gqa: str = "uniform"  # grouped-query attention: uniform | groups | free (headprune.selection.gqa)
    kv: float | None = None  # share of the KV-cache bytes per token kept, 0..1 (drops whole key/value groups)
    same_per_site: bool = False  # the same heads kept in every site: a stock config can describe the result

    def __post_init__(self):
        given = {k: v for k, v in (("keep", self.keep), ("n_keep", self.n_keep), ("flops", self.flops),
                                   ("kv", self.kv)) if v is not None}
        if len(given) != 1:
            raise ConfigError(f"give exactly one budget: keep (share of heads), n_keep (number of heads), flops "
                              f"(share of head FLOPs) or kv (share of KV-cache bytes); got {given or 'none'}")
        check_share("kv", self.kv, optional=True)
        check_choice("gqa", self.gqa, GQA_MODES)
        if self.same_per_site and (self.gqa == "free" or self.flops is not None or self.kv is not None):
            raise ConfigError(f"same_per_site=True needs gqa 'uniform' or 'groups' and a head budget (keep or n_keep); "
                              f"got gqa={self.gqa!r}, {given}")
        check_share("keep", self.keep, optional=True)
        check_share("flops", self.flops, optional=True)
        check_int("n_keep", self.n_keep, 0, optional=True)
        check_choice("method", self.method, METHODS)
        check_int("min_per_site", self.min_per_site, 0)
        check_int("seq_len", self.seq_len, 1)
        check_int("tgt_len", self.tgt_len, 1, optional=True)
        check_number("damping", self.damping, low=0)
        check_number("max_scale", self.max_scale, low=0, strict=True)
        check_choice("target", self.target, TARGETS)
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
class CompressPlan:
    """What to do to the model: ``drop`` (:data:`~headprune.core.surgery.DroppedHeads`), ``scales`` ({site: [H]} tuned mask
    values, or None), the Fisher loss estimate before / after rearrangement, tuning per site, the
    measured mean calibration loss after each stage and the stages the guard turned down."""

    drop: DroppedHeads
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
               sites: list[str] | None = None, loss_fn: LossFn | None = None, progress: bool = False) -> CompressPlan:
    """The heads to drop and the kept heads' scales under ``settings``; ``model`` is not changed.

    ``scored``/``costs`` reuse scores (:func:`score_heads`) and prices (:func:`headprune.core.cost.head_costs`)
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
    groups = kv_groups(model)
    drop = select_gqa(scored.scores, groups, mode=settings.gqa, keep=settings.keep, n_keep=settings.n_keep,
                      flops=settings.flops, costs=costs, kv=settings.kv,
                      kv_bytes=kv_head_bytes(model) if settings.kv is not None else None,
                      min_per_site=settings.min_per_site, sites=sites, same_per_site=settings.same_per_site)
    plan = CompressPlan(drop=drop, seconds=seconds)
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
        within = settings.gqa != "free" or settings.kv is not None  # keep the kept heads per key/value group
        moved = rearrange(drop, scored.fisher, groups=groups if within or settings.flops is not None else None,
                          within_groups=within)  # a FLOP budget: no key/value head more
        plan.loss_estimate["rearranged"] = scored.fisher.loss_increase(moved) / scored.fisher.n
        seconds["rearrange"] = time.perf_counter() - start
        plan.drop = _guarded(plan, "rearranged", CompressPlan(drop=moved), model, batches, loss_fn, guarded, seconds).drop
    if settings.tunes and plan.drop:  # nothing dropped: the unit scales are the exact answer
        start = time.perf_counter()
        tuned = tune_scales(model, batches, plan.drop, damping=settings.damping, max_scale=settings.max_scale,
                            target=settings.target, progress=progress)
        plan.tuning = tuned.sites
        seconds["tune"] = time.perf_counter() - start
        plan.scales = _guarded(plan, "tuned", CompressPlan(drop=plan.drop, scales=tuned.scales), model, batches, loss_fn,
                               guarded, seconds).scales
    return plan


def _guarded(plan: CompressPlan, stage: str, candidate: CompressPlan, model, batches, loss_fn, guarded: bool,
             seconds: dict) -> CompressPlan:
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
