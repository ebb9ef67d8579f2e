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
pass over the calibration batches per stage, :mod:`.guard`); ``CompressPlan.stages`` / ``losses`` say what
happened. The stages are the plan-stage compensations' own ``refine`` (:mod:`.compensations.rearrange`,
:mod:`.compensations.tune`), run in order on a :class:`PlanContext`.

Budgets are global across sites and kinds (:mod:`headprune.selection.budget`): :class:`~.settings.PruneSettings`'s
``share`` of ``price`` count (heads), flops (the attention heads' FLOPs at ``seq_len``) or kv (KV-cache bytes), or
``n_keep`` heads. :func:`plan_heads` gives the plan as data (dropped heads, scales) without touching the model;
:func:`headprune.compression.compress` applies it: folds the scales, physically removes the heads and reports
sizes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from ..core.cut.surgery import DroppedHeads
from ..core.masks.masking import HeadMask
from ..core.model.cost import HeadCosts, head_costs
from ..core.model.finite import check_finite_scores, check_finite_weights
from ..core.model.kvcache import kv_head_bytes
from ..errors import ConfigError
from ..scoring.fisher import Fisher
from ..scoring.gradients import LossFn
from ..scoring.registry import get_scorer, scorer_names
from ..scoring.scorer import Scorer, ScoreRequest
from ..selection.budgets import Budget
from ..selection.gqa import kv_groups, select_gqa
from .guard import Guard, State
from .settings import PruneSettings
from .tuning import scale_mask


@dataclass
class Scores:
    """Head scores of one method on one calibration set (reusable across budgets)."""

    method: str
    scores: dict[str, torch.Tensor]  # {site: [H]}, higher = keep
    fisher: Fisher | None = None  # for rearrangement and the loss estimate
    seconds: float = 0.0


@dataclass
class CompressPlan:
    """What to do to the model: ``drop`` (:data:`~headprune.core.cut.surgery.DroppedHeads`), ``scales`` ({site: [H]} tuned mask
    values, or None), the Fisher loss estimate before / after rearrangement, tuning per site, and the guard's
    stage log with the mean calibration loss of each state it measured."""

    drop: DroppedHeads
    scales: dict[str, torch.Tensor] | None = None
    loss_estimate: dict[str, float] = field(default_factory=dict)
    tuning: list[dict] = field(default_factory=list)
    stages: dict[str, str] = field(default_factory=dict)  # the guard's stage log: stage -> "kept" | "rejected (...)"
    losses: dict[str, float] = field(default_factory=dict)  # the mean calibration loss of each state measured
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def rejected(self) -> list[str]:
        """The stages the guard turned down, in order."""
        return [s for s, note in self.stages.items() if note.startswith("rejected")]

    def mask(self, model: nn.Module) -> HeadMask:
        """The plan as a head mask (dropped heads 0, kept heads their scale): what the compressed model computes."""
        return scale_mask(model, self.drop, self.scales)


def score_heads(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], method: str | Scorer, *,
                loss_fn: LossFn | None = None, seed: int = 0, progress: bool = False) -> Scores:
    """Head scores of ``method`` (a registered scorer's name -- ``ih``, ``fisher``, ``random`` -- or a
    :class:`~headprune.scoring.scorer.Scorer` that can feed the head plan) over calibration ``batches``. NaN or inf
    weights, and scores a scorer returns with NaN or inf, are refused (:class:`~headprune.errors.NonFiniteError`)."""
    scorer = get_scorer(method)
    if not scorer.plan:
        allowed = ", ".join(n for n in scorer_names() if get_scorer(n).plan)
        raise ConfigError(f"method={scorer.name!r} scores no heads for the head plan; allowed: {allowed}")
    check_finite_weights(model)
    start = time.perf_counter()
    found = scorer.score(model, list(batches), ScoreRequest(units="heads", blocks=True, loss_fn=loss_fn, seed=seed,
                                                            progress=progress))
    check_finite_scores(found.heads, f"the {scorer.name} scores")
    return Scores(scorer.name, dict(found.heads), found.fisher if scorer.fisher else None, time.perf_counter() - start)


def plan_heads(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], settings: PruneSettings, *,
               scored: Scores | None = None, costs: HeadCosts | None = None, sites: list[str] | None = None,
               loss_fn: LossFn | None = None, n_keep: int | None = None, progress: bool = False) -> CompressPlan:
    """The heads to drop and the kept heads' scales under ``settings`` (heads only, a count / flops / kv budget,
    compensate none | rearrange | tune); ``model`` is not changed.

    ``scored``/``costs`` reuse scores (:func:`score_heads`) and prices (:func:`headprune.core.model.cost.head_costs`)
    computed before, e.g. for several budgets on one model. ``sites``: prune only these sites (the
    budget is then a share / count of their heads or FLOPs); the others keep every head. ``n_keep``: a count
    of heads kept in place of the settings' budget, 0 allowed (a pruning curve's last step). NaN or inf weights,
    losses or scores are refused (:class:`~headprune.errors.NonFiniteError`). The plan-stage compensations
    (``rearrange``, ``tune``) then refine the selection in order, each through the guard on the calibration loss.
    """
    if not isinstance(settings, PruneSettings) or not settings.head_plan:
        raise ConfigError(f"settings={settings!r}; allowed: PruneSettings with units='heads', price count | flops | "
                          "kv, compensate none | rearrange | tune")
    check_finite_weights(model)
    batches = list(batches)
    family = settings.scorer.name
    if scored is None:
        scored = score_heads(model, batches, settings.scorer, loss_fn=loss_fn, seed=settings.seed, progress=progress)
    elif scored.method != family:
        raise ConfigError(f"scored: scores of method {scored.method!r}; scores={family!r} needs {family!r}")
    seconds = {"score": scored.seconds}
    start = time.perf_counter()
    budget = Budget.of(n_keep=n_keep) if n_keep is not None else settings.budget
    if budget.price == "flops" and costs is None:
        costs = head_costs(model, settings.seq_len, tgt_len=settings.tgt_len)
    groups = kv_groups(model)
    drop = select_gqa(scored.scores, groups, budget, settings.head_rule(sites),
                      kv_head_bytes(model) if budget.price == "kv" else costs)
    plan = CompressPlan(drop=drop, seconds=seconds)
    if scored.fisher is not None:
        plan.loss_estimate["selected"] = scored.fisher.loss_increase(drop) / scored.fisher.n
    seconds["select"] = time.perf_counter() - start
    refinements = [c for c in settings.compensations if c.stage == "plan"]
    guard = Guard(batches, "calibration", loss_fn, enabled=settings.guard and bool(refinements) and bool(drop))
    if guard.enabled:
        guard.measure(State("selected", model, plan.mask(model)))
        seconds["guard"] = guard.seconds
    within = settings.gqa != "free" or budget.price == "kv"  # keep the kept heads per key/value group
    ctx = PlanContext(model, batches, settings, scored.fisher, groups if within or budget.price == "flops" else None,
                      within, guard, loss_fn, progress)
    for refinement in refinements:
        plan = cast(Any, refinement).refine(ctx, plan)
    if guard.enabled:
        seconds["guard"] = guard.seconds
    plan.stages, plan.losses = guard.stages, guard.losses
    return plan


@dataclass
class PlanContext:
    """What a plan-stage compensation (``refine(ctx, plan) -> plan``) reads: the unpruned model, the calibration
    batches, the settings, the Fisher blocks, the key/value groups rearrangement keeps its swaps within (None:
    anywhere), and the guard every refinement passes through (:mod:`.guard`, on the calibration loss)."""

    model: nn.Module
    batches: list
    settings: PruneSettings
    fisher: Fisher | None
    groups: dict | None  # rearrangement's groups (a FLOP budget: no key/value head more)
    within_groups: bool  # swaps only within a key/value group
    guard: Guard
    loss_fn: LossFn | None = None
    progress: bool = False
    rearranged: bool = False  # rearrangement has run (tune implies it; it runs once)

    def keep(self, stage: str, key: str, plan: CompressPlan, candidate: CompressPlan) -> CompressPlan:
        """``candidate`` (the plan after ``stage``) unless the guard measures a higher calibration loss than
        ``plan``; the verdict goes in the stage log. A candidate that changes nothing is kept unmeasured."""
        if candidate.drop == plan.drop and candidate.scales is None:
            self.guard.note(stage, "kept (no change)")
            return candidate
        if not self.guard.enabled:
            self.guard.note(stage, "kept (unguarded)")
            return candidate
        current = State(self._current_key(), self.model, plan.mask(self.model))
        kept = self.guard.judge(stage, current, State(key, self.model, candidate.mask(self.model)))
        return candidate if kept else plan

    def _current_key(self) -> str:
        """The state kept so far: the one of least loss (the stages kept only ever lowered it)."""
        losses = self.guard.losses
        return min(losses, key=losses.__getitem__)
