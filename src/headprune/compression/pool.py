"""The budget over heads and neurons: the selection step of :func:`headprune.compression.compress` for FFN
neurons, both kinds, ``params`` / ``latency`` prices, fluctuation scores and stand-ins (:func:`select_and_cut`),
and the stages after every cut (:func:`refits`), judged on held-out data by the guard (:mod:`.guard`).

Stages (each recorded; the summary says which were kept):

1. *score*: per-example mask gradients of every head and neuron in one backward per batch
   (``scores="fisher"``, :func:`headprune.scoring.units.unit_fisher`), or FLAP's fluctuation of their inputs
   from one forward, no labels (:mod:`headprune.scoring.fluctuation`: ``scores="fluctuation"`` standardised per
   kind over all layers and ranked together as FLAP does; ``"fluctuation-raw"`` not standardised, the expected
   squared output change of holding each unit at its mean, traded against price), on the calibration batches;
2. *select*: one global budget over the pool (``units``: heads, neurons or both), priced in FLOPs at
   ``seq_len``, parameters, or measured seconds (:mod:`headprune.selection.units`);
3. *bias* (``compensate="bias"`` or ``["bias", "reconstruct"]``): every removed unit's input held at its calibration
   mean, folded into its output projection's bias (:mod:`headprune.core.cut.biases`; one added where there is none):
   exact mean replacement, so it is not guarded (FLAP's bias compensation);
4. *remove*: physical surgery of heads and neurons (exactly what masking them computes);
5. *reconstruct* (``compensate="reconstruct"`` or ``["bias", "reconstruct"]``, the bias then refitted too): least-squares refit of every output / down projection
   (:mod:`.reconstruct`) on the calibration batches -- or on ``fit_batches``, more examples than the
   scores need: the refit uses no labels, and with ``k x d_out`` numbers per projection it overfits a
   few thousand tokens (on the SST-2 MiniLM classifier at 60% of FLOPs, 4096 phrases instead of 512
   cut the KL divergence from the unpruned model by a third on held-out sentences,
   ``benchmarks/fit_size.py``) -- kept only if it lowers the mean loss on the
   *validation* batches, which neither the scores nor the fit saw (``val_batches``; else the settings' ``val_share`` of the
   calibration batches, spread over their order, are held out for it). With three disjoint sets --
   calibration, validation, and the test data the result is reported on -- the guard cannot hide a
   fit that only helps the examples it was fitted to.
6. *distill* (``compensate=[..., "distill"]`` or ``Distill(epochs=..., lr=...)``, off by default): every weight of
   the pruned model trained for a few passes over the fit batches to match the unpruned model's output distribution
   (:mod:`.distill`; no labels read), kept only if it lowers the validation loss further.

Every scoring pass runs inside :func:`headprune.scoring.checkpointed_blocks` (one input per block kept, each
block's activations recomputed in the backward: the same scores). The copy the stand-in and the cut work on shares
every tensor but the output projections with the model passed (:mod:`.copies`).

``low_memory=True`` (for a model near the machine's memory; no refit, no distillation) changes how, not what:
the scoring pass gathers no second moments; linear stand-ins gather theirs one block at a time (:mod:`.blockwise`: the same moments);
the cut is made on the model passed, which becomes the returned model (no copy). Same scores, units and weights.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from ..core.cut.surgery import kept_heads
from ..core.model.ffn import find_ffns
from ..core.model.finite import check_finite_scores
from ..core.model.kept import kept_neurons
from ..core.model.sites import find_sites
from ..core.model.unit_cost import UnitCosts, unit_costs
from ..core.prune import prune_heads, prune_neurons
from ..errors import ConfigError
from ..scoring.checkpointing import checkpointed_blocks
from ..scoring.fluctuation import channel_stats
from ..scoring.gradients import LossFn
from ..scoring.scorer import ScoreRequest
from ..selection.aligned import Widths, select_aligned
from ..selection.budgets import Budget
from ..selection.gqa import kv_groups
from ..selection.units import select_units
from .blockwise import blockwise_standins
from .compensation import compensation_spec
from .copies import working_copy
from .guard import Guard, State
from .settings import PruneSettings


def check_pool_inputs(model: nn.Module, settings: PruneSettings, prices: UnitCosts | None, val_batches,
                      fit_batches) -> None:
    """Refuse, before any work, what the budget over heads and neurons cannot do with its inputs."""
    if settings.price == "latency" and prices is None:
        raise ConfigError("price='latency' needs prices= (a latency table measured on the target machine)")
    if prices is not None and settings.steps > 1:
        raise ConfigError(f"prices= with steps={settings.steps}: the table prices the units of the model passed, not "
                          "of the smaller ones later rounds score; allowed: steps=1")
    if settings.units != "heads" and not find_ffns(model):
        raise ConfigError(f"units={settings.units!r}: {type(model).__name__} has no feed-forward block headprune "
                          "can find; allowed: units='heads'")
    if fit_batches is not None:
        if not fit_batches:
            raise ConfigError("fit_batches: empty; allowed: inputs for the reconstruction, or None (the calibration "
                              "batches)")
        if val_batches is None and guarded(settings):
            raise ConfigError("fit_batches without val_batches: the guard's validation part would be held out of the "
                              "calibration batches, which fit_batches may contain; allowed: pass val_batches too")


@dataclass
class Run:
    """What the stages of one :func:`headprune.compression.compress` call read and record."""

    model: nn.Module  # the unpruned model (the teacher)
    settings: PruneSettings
    loss_fn: LossFn | None
    verify: bool
    progress: bool
    guard: Guard  # on the validation batches: the refits and distillation pass through it; its log is the run's
    seconds: dict = field(default_factory=dict)

    def keep_if_better(self, stage: str, key: str, candidate: nn.Module, current: State) -> State:
        """The state kept after ``stage``: ``candidate`` (``key``) unless the guard measures a higher validation
        loss than ``current`` (the unpruned model's loss measured first, for the record)."""
        if self.guard.enabled:
            self.guard.measure(State("unpruned", self.model))
        after = State(key, candidate)
        return after if self.guard.judge(stage, current, after) else current


def select_and_cut(run: Run, calib: list, prices: UnitCosts | None) -> tuple[nn.Module, dict, dict, dict]:
    """(the pruned model, heads dropped, neurons dropped, the result's fields): the budget over heads and neurons'
    selection, in ``settings.steps`` rounds, with its stand-in and the cut."""
    settings = run.settings
    costs = prices if prices is not None else unit_costs(run.model, settings.price, seq_len=settings.seq_len,
                                                          tgt_len=settings.tgt_len)
    pruned, drop_h, drop_n, selection = _rounds(run, calib, costs)
    return pruned, drop_h, drop_n, {"selection": selection}


def _rounds(run: Run, calib: list, costs: UnitCosts) -> tuple[nn.Module, dict, dict, dict]:
    """(the pruned model, heads dropped, neurons dropped, the selection's record) after ``settings.steps`` rounds of score, select, stand-in and cut. Round ``i`` of ``k`` brings the
    pool's price down to ``1 - i/k`` of the way to the budget, scored on the model the rounds before left (each
    round's scores see the units already gone and the stand-ins already folded); the units dropped are given as
    indices of the model passed. With ``step_standin`` the rounds fold that stand-in and only choose the units: the
    settings' own stand-in then runs once, on the model passed (``obs-seq`` re-choosing which units of each site and
    FFN go, on the pruned model's inputs), so one sequential pass serves all the rounds. Every round scores on
    ``score_batches`` of the calibration batches (one number, or one per round)."""
    settings, model = run.settings, run.model
    current, records = model, []
    # read before any cut: with low_memory the first round cuts ``model`` itself
    heads_before = kept_heads(model) if settings.steps > 1 else {}
    neurons_before = kept_neurons(model) if settings.steps > 1 and find_ffns(model, skip_moe=True) else {}
    total, kept_share = costs.total(), 1.0 if settings.share is None else settings.share  # None: refused by _select
    step = settings.round_standin
    once = step is not None  # the rounds fold step_standin; settings' own stand-in runs once, after
    rounds = replace(run, settings=_step_settings(settings)) if once else run
    for i in range(1, settings.steps + 1):
        t = time.perf_counter()
        if i > 1:
            costs = unit_costs(current, settings.price, seq_len=settings.seq_len, tgt_len=settings.tgt_len)
        now = rounds.settings if settings.steps == 1 else replace(
            rounds.settings, share=min(1.0, total * (1 - (1 - kept_share) * i / settings.steps) / costs.total()))
        last_choice = once and i == settings.steps  # this round only chooses: no moments, no fold, no cut
        if last_choice:
            now = replace(now, compensate=[])
        scoring = _scoring_batches(calib, settings.round_score_batches(i))
        head_scores, neuron_scores, stats = _scores(current, scoring, now, costs, run.loss_fn, run.progress)
        run.seconds["score"] = run.seconds.get("score", 0.0) + time.perf_counter() - t
        drop_h, drop_n, selection = _select(current, now, costs, head_scores, neuron_scores)
        records.append(selection)
        if last_choice:
            break
        current, drop_h, drop_n = _cut(rounds, current, calib, stats, drop_h, drop_n, inplace=i > 1)
    if settings.steps == 1:
        return current, drop_h, drop_n, records[0]
    after_h, after_n = kept_heads(current), kept_neurons(current) if neurons_before else {}
    if once:  # the last round's choice, as indices of ``current``, taken out of what it keeps
        after_h, after_n = _without(after_h, drop_h), _without(after_n, drop_n)
    drop_h = _dropped(heads_before, after_h)
    drop_n = _dropped(neurons_before, after_n) if neurons_before else {}
    if step is None:
        return current, drop_h, drop_n, {"steps": records}
    del current  # the rounds chose the units; the stand-in now runs once on the model passed (its indices)
    pruned, drop_h, drop_n = _cut(run, model, calib, None, drop_h, drop_n)
    return pruned, drop_h, drop_n, {"steps": records, "step_standin": compensation_spec(step)}


def _step_settings(settings: PruneSettings) -> PruneSettings:
    """The settings of the rounds when ``step_standin`` is set: that stand-in alone (with its own settings)."""
    return replace(settings, compensate=[settings.round_standin], step_standin=None)


def _scoring_batches(calib: list, k: int) -> list:
    """``k`` of the calibration batches spread over their order, the first included (``k`` 0 or more than there
    are: all)."""
    if not k or k >= len(calib):
        return calib
    return [calib[int(i * len(calib) / k)] for i in range(k)]


def _without(kept: Mapping[str, list[int]], drop: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """{name: the units of ``kept`` left once the positions ``drop[name]`` go}."""
    out = {}
    for name, units in kept.items():
        gone = {int(j) for j in drop.get(name, ())}
        out[name] = [u for j, u in enumerate(units) if j not in gone]
    return out


def _dropped(before: Mapping[str, list[int]], after: Mapping[str, list[int]]) -> dict[str, list[int]]:
    """{name: positions in ``before`` (original indices kept then) of the units no longer kept ``after``}."""
    out = {}
    for name, kept in before.items():
        still = set(after.get(name, ()))
        out[name] = [j for j, unit in enumerate(kept) if unit not in still]
    return out


def _select(model: nn.Module, settings: PruneSettings, costs: UnitCosts, head_scores: dict, neuron_scores: dict):
    """(heads dropped, neurons dropped, the selection's record): the one budget over heads and neurons, in whole
    blocks of ``multiple_of`` where that is set (:mod:`headprune.selection.aligned`)."""
    share = settings.share
    if share is None:  # PruneSettings refuses n_keep for this budget; typed for the search
        raise ConfigError("the budget over heads and neurons needs share=; allowed: a share in (0, 1]")
    budget, rule = Budget.of(share=share), settings.head_rule()
    if settings.multiple_of > 1:
        widths = Widths(settings.multiple_of, {s.name: s.head_dim for s in find_sites(model)})
        return select_aligned(head_scores, neuron_scores, costs, budget, widths, groups=kv_groups(model),
                              units=settings.units, rule=rule)
    return select_units(head_scores, neuron_scores, costs, budget, groups=kv_groups(model), units=settings.units,
                        rule=rule)


def _cut(run: Run, model: nn.Module, calib: list, stats, drop_h: dict, drop_n: dict,
         inplace: bool = False) -> tuple[nn.Module, dict, dict]:
    """(a pruned copy of ``model`` sharing the tensors no stand-in writes (:func:`.copies.working_copy`; ``inplace``:
    ``model``), the heads and neurons dropped): the stand-in (which may re-choose the units within each site / FFN:
    ``obs-seq``), the cut."""
    t = time.perf_counter()
    settings = run.settings
    # low_memory: no stage after reads the original; a later round: ``model`` is the rounds' own copy; else a copy
    # sharing all but the output projections with ``model`` (compress gives the result its own tensors at the end)
    pruned = model if settings.low_memory or inplace else working_copy(model)
    standin: Any = settings.standin  # a stand-in compensation: gram, apply (compensation.check_compensation)
    if standin is not None and (any(drop_h.values()) or any(drop_n.values())):
        if _block_by_block(settings):  # one block's moments at a time
            sequential = _sequential(standin)  # fitted on the pruned model's inputs: fold into the copy as it goes
            note, added, (drop_h, drop_n) = blockwise_standins(pruned if sequential else model, calib, standin,
                                                               drop_h, drop_n, settings, run.progress,
                                                               sequential=sequential)
            done = (note, added)
        else:
            if stats is None or (standin.gram and stats.second is None):  # before the cut, which keeps biases
                stats = channel_stats(model, calib, heads=any(drop_h.values()), neurons=any(drop_n.values()),
                                      gram=standin.gram, progress=run.progress)
            done = standin.apply(pruned, model, stats, drop_h, drop_n, settings)
        run.guard.note(standin.name, done[0] if isinstance(done, tuple) else done)
    heads, neurons = {k: v for k, v in drop_h.items() if v}, {k: v for k, v in drop_n.items() if v}
    # low_memory: one site / FFN per cut, so the snapshot that makes a cut atomic holds the old weights of one, not
    # of all (at 1B, all FFNs' old and new weights at once were 2.4 GB beside the model)
    parts = (lambda d: [{k: v} for k, v in d.items()]) if settings.low_memory else (lambda d: [d] if d else [])
    for part in parts(heads) or [{}]:
        prune_heads(pruned, part, verify=False)  # verified above (or trusted)
    for i, part in enumerate(parts(neurons)):
        prune_neurons(pruned, part, verify=run.verify and i == 0)  # its own trial, once
    pruned.eval()
    run.seconds["select+remove"] = run.seconds.get("select+remove", 0.0) + time.perf_counter() - t
    run.guard.note("remove", "kept")
    return pruned, drop_h, drop_n


def refits(run: Run, pruned: nn.Module, fit: list, val: list) -> tuple[nn.Module, list, dict]:
    """(the model kept, the refits' rows, the distillation's record): the refit-stage compensations in the order
    given (``reconstruct``, ``distill``), each kept only where the guard says so. A refit returns rows (the result's
    ``reconstruction``) or one dict (its record: ``distill``'s is the result's ``distillation``)."""
    model, settings = run.model, run.settings
    rows: list = []
    distilled: dict = {}
    current = State("pruned", pruned)
    run.guard.note("reconstruct", "skipped")
    refit_stages: tuple[Any, ...] = settings.refits  # refit compensations: apply (compensation.check_compensation)
    for refit in refit_stages:  # in the order given, each on the model the ones before left
        t = time.perf_counter()
        candidate = copy.deepcopy(current.model)
        found = refit.apply(candidate, model, fit, settings, run.progress)
        if isinstance(found, dict):
            distilled = found
        else:
            rows += found or []
        run.seconds[refit.name] = time.perf_counter() - t
        current = run.keep_if_better(refit.name, getattr(refit, "done", refit.name), candidate, current)
    return current.model, rows, distilled


def _scores(model: nn.Module, calib: list, settings: PruneSettings, costs: UnitCosts, loss_fn, progress: bool):
    """(head scores, neuron scores, channel statistics or None) of ``settings.scorer`` for the one-budget search."""
    standin: Any = settings.standin
    later = _block_by_block(settings)  # the stand-in's moments come block by block, after the selection
    request = ScoreRequest(units=settings.units, loss_fn=loss_fn, seed=settings.seed, costs=costs,
                           stats=standin is not None and not later, gram=bool(standin and standin.gram) and not later,
                           progress=progress)
    # one input per block kept, each block's activations recomputed in the backward: the same scores (the same
    # operations on the same inputs) and moments (counted once per batch), without every block's activations at once
    with checkpointed_blocks(model):
        found = settings.scorer.score(model, calib, request)
    check_finite_scores({**found.heads, **found.neurons}, f"the {settings.scorer.name} scores")
    return found.heads, found.neurons, found.stats


def _sequential(standin: Any) -> bool:
    """Whether a stand-in compensation is fitted on the pruned model's inputs, block after block (``linear-seq``)."""
    return bool(getattr(standin, "sequential", False))


def _block_by_block(settings: PruneSettings) -> bool:
    """Whether the stand-in's moments are gathered one block at a time (:mod:`.blockwise`) rather than in the
    scoring pass: a sequential stand-in, or second moments under ``low_memory``."""
    standin: Any = settings.standin
    return standin is not None and (_sequential(standin) or (settings.low_memory and bool(standin.gram)))


def split(batches: list, val_batches, settings: PruneSettings) -> tuple[list, list]:
    """(calibration, validation) batches: ``val_batches`` as given, else the last share held out."""
    if val_batches is not None:
        val = list(val_batches)
        if not val:
            raise ConfigError("val_batches: empty; allowed: labelled batches disjoint from the calibration data")
        return batches, val
    if not guarded(settings):
        return batches, []
    if len(batches) < 2:
        raise ConfigError(f"calibration has {len(batches)} batch; holding out a validation part needs >= 2 batches "
                          "(or pass val_batches)")
    n = len(batches)
    n_val = min(n - 1, max(1, math.ceil(settings.val_share * n)))
    held = held_out(n, n_val)
    return [b for i, b in enumerate(batches) if i not in held], [batches[i] for i in sorted(held)]


def guarded(settings: PruneSettings) -> bool:
    """Whether a compensation stage runs and is judged on validation data."""
    return settings.guard and bool(settings.refits)


def held_out(n: int, n_val: int) -> set[int]:
    """``n_val`` of ``n`` batch positions spread evenly over the order (evaluators yield batches sorted by
    length, so the last ones would be the shortest examples only)."""
    return {min(n - 1, int((i + 0.5) * n / n_val)) for i in range(n_val)}


def examples(batches: list) -> int:
    return sum(int(next(iter(b.values())).shape[0]) for b in batches)
