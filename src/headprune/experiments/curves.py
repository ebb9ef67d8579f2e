"""Pruning curves (paper 4.2, 5, 6; Figs. 3-6): mask a growing share of heads, score each step.

Orders: ``importance`` (I_h computed once), ``importance-iterative`` (I_h recomputed under the
current mask after every step), ``oracle`` (the one-head ablation damage), ``random`` (one curve
per seed; report mean +- std), and beyond the paper (Kwon et al. 2022, :mod:`headprune.compression`)
``fisher``, ``fisher+rearrange`` and ``fisher+tune`` (the Fisher computed once on the calibration
batches; tuned scales are applied as mask values, which is what the folded, pruned model computes).
The pool can be restricted to one attention kind (paper Fig. 4: the share is then of that kind's
heads), and ``min_per_site`` keeps heads in every site.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..compression.plan import plan_heads, score_heads
from ..compression.settings import PruneSettings
from ..core.masks.masking import mask_from_heads
from ..core.model.sites import find_sites
from ..distributed import map_units
from ..errors import ConfigError
from ..progress import progress_bar
from ..selection.budgets import Budget, HeadRule
from ..selection.gqa import GQA_MODES, kv_groups, select_gqa
from .rundir import RunDir

PLANNED = ("fisher", "fisher+rearrange", "fisher+tune")  # headprune.compression methods: need calibration batches
ORDERS = ("importance", "importance-iterative", "oracle", "random", *PLANNED)


@dataclass
class CurveSettings:
    fractions: tuple[float, ...] = tuple(i / 10 for i in range(11))
    orders: tuple[str, ...] = ("importance", "oracle", "random")
    seeds: tuple[int, ...] = (0, 1, 2)  # for the random order
    kinds: tuple[str, ...] | None = None  # restrict the pool to these attention kinds
    min_per_site: int = 0
    gqa: str = "uniform"  # grouped-query attention: uniform | groups | free (headprune.selection.gqa)

    def __post_init__(self):
        self.fractions = tuple(sorted(set(float(f) for f in self.fractions)))
        if not self.fractions or self.fractions[0] < 0 or self.fractions[-1] > 1:
            raise ConfigError(f"fractions={self.fractions}; allowed: values in 0..1")
        bad = [o for o in self.orders if o not in ORDERS]
        if bad or not self.orders:
            raise ConfigError(f"orders: {bad or 'none given'}; allowed: {', '.join(ORDERS)}")
        if self.kinds is not None and (bad := [k for k in self.kinds if k not in ("encoder", "decoder", "cross")]):
            raise ConfigError(f"kinds: {bad}; allowed: encoder, decoder, cross")
        if self.min_per_site < 0:
            raise ConfigError(f"min_per_site={self.min_per_site}; allowed: >= 0")
        if self.gqa not in GQA_MODES:
            raise ConfigError(f"gqa={self.gqa!r}; allowed: {', '.join(GQA_MODES)}")


@dataclass(frozen=True)
class CurveInputs:
    """What the orders read besides the model: ``importance(mask) -> {site: I_h}`` (the importance
    orders; under ``mask`` for the iterative one), ``oracle`` {site: damage [H]} from a one-head ablation,
    ``calibration() -> batches`` for the Fisher orders (disjoint from the evaluator's data)."""

    importance: Callable[[Mapping[str, torch.Tensor] | None], dict[str, torch.Tensor]] | None = None
    oracle: Mapping[str, torch.Tensor] | None = None
    calibration: Callable[[], Iterable] | None = None

    def __post_init__(self) -> None:
        for name in ("importance", "calibration"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ConfigError(f"{name}={getattr(self, name)!r}; allowed: a callable or None")
        if self.oracle is not None and not isinstance(self.oracle, Mapping):
            raise ConfigError(f"oracle={type(self.oracle).__name__}; allowed: a mapping site -> damage per head")

    def check(self, orders: Iterable[str]) -> None:
        """Every order in ``orders`` has what it reads."""
        for order in orders:
            if order == "oracle" and self.oracle is None:
                raise ConfigError("order 'oracle' needs one-head ablation damages (oracle=)")
            if order.startswith("importance") and self.importance is None:
                raise ConfigError(f"order {order!r} needs an importance scorer (importance=)")
            if order in PLANNED and self.calibration is None:
                raise ConfigError(f"order {order!r} needs calibration batches (calibration=)")


def step_counts(total: int, fractions: Iterable[float]) -> list[int]:
    return [int(round(f * total)) for f in fractions]


def pruning_curves(
    model: nn.Module,
    evaluator,
    *,
    settings: CurveSettings,
    inputs: CurveInputs = CurveInputs(),
    run: RunDir | None = None,
    unit_prefix: str = "",
    progress: bool = True,
    intervals: bool = False,
) -> list[dict]:
    """One row per (order, seed, step): fraction, heads pruned, score, score relative to unpruned.

    ``intervals``: each step also gets the two-sided ``p_value`` of its change from the unpruned model
    and ``ci_low``/``ci_high``, the 95% interval of that change from the same paired test
    (:func:`headprune.evaluation.significance.compare`, 1000 resamples where it resamples, seed 0;
    needs the ``study`` extra). :func:`no_significant_loss` reads them.

    ``inputs``: what the orders read (:class:`CurveInputs`). Masks only: nothing is removed.
    """
    sites = find_sites(model)
    pool = [s.name for s in sites if settings.kinds is None or s.kind in settings.kinds]
    if not pool:
        raise ConfigError(f"kinds={settings.kinds}: the model has no such sites ({sorted({s.kind for s in sites})})")
    jobs = [(o, seed) for o in settings.orders for seed in (settings.seeds if o == "random" else (0,))]
    inputs.check(o for o, _ in jobs)
    drops = _Drops(model, settings, inputs, sites, pool)
    total = sum(drops.shape[n] for n in pool)
    counts = step_counts(total, settings.fractions)
    seen: dict[tuple, float] = {}
    higher_is_better = getattr(evaluator, "higher_is_better", True)
    bar = progress_bar(total=len(jobs) * len(counts), desc="pruning curve", unit="step", show=progress)
    tests: dict[tuple, dict] = {}
    base_result: list = []  # the unpruned model's evaluation, made when the first interval needs it
    by_job = {f"{unit_prefix}{order}:{seed}": (order, seed) for order, seed in jobs}

    def compute(job: str) -> list[tuple[str, dict]]:  # one order and seed: its steps, each needing the last
        nonlocal higher_is_better
        order, seed = by_job[job]
        done: list[tuple[str, dict]] = []
        dropped: dict[str, list[int]] = {}
        for step, (fraction, n) in enumerate(zip(settings.fractions, counts, strict=True)):
            key = f"{job}:{step}"
            if run is not None and run.done(key):
                record = run.get(key)
                dropped = {k: list(v) for k, v in record["dropped"].items()}
                done.append((key, {k: v for k, v in record.items() if k != "unit"}))
                bar.update()
                continue
            dropped, mask = drops.at(order, seed, n, dropped)  # mask: a float mask (tuned scales) or None
            plan_key = tuple(sorted((k, tuple(v)) for k, v in dropped.items()))
            if mask is not None:
                plan_key += (tuple(round(float(x), 7) for v in mask.values() for x in v),)
            else:
                mask = mask_from_heads(sites, dropped) if dropped else None
            if plan_key not in seen:  # the same mask (step 0, all heads off) is scored once
                result = evaluator.evaluate(model, mask)
                seen[plan_key], higher_is_better = result.score, result.higher_is_better
                if intervals:
                    tests[plan_key] = _interval(model, evaluator, result, base_result)
            row = {"order": order, "seed": seed, "step": step, "fraction": fraction,
                   "pruned": sum(len(v) for v in dropped.values()), "of": total, "score": seen[plan_key],
                   "dropped": dropped, **tests.get(plan_key, {})}
            done.append((key, row))
            if run is not None:  # saved step by step (by rank 0; the others' rows when gathered)
                run.add(key, row)
            bar.update()
        return done

    found = map_units(list(by_job), compute, run)  # each (order, seed) once, on one rank under torchrun
    rows = [found[f"{job}:{step}"] for job in by_job for step in range(len(counts))]
    bar.close()
    return _relative(rows, higher_is_better)


def _relative(rows: list[dict], higher_is_better: bool) -> list[dict]:
    """``rows`` with each score relative to the unpruned one: > 1 is better than unpruned, whatever the
    metric's direction."""
    unpruned = next((r["score"] for r in rows if r["pruned"] == 0), None)
    for r in rows:
        ratio = (r["score"] / unpruned if higher_is_better else unpruned / r["score"]) if unpruned and r["score"] else 0.0
        r["relative"] = ratio
    return rows


class _Drops:
    """The heads each order drops at a step, over one pool of sites (I_h for the fixed order, and the Fisher
    with its calibration batches for the Fisher orders, computed once when first needed)."""

    def __init__(self, model: nn.Module, settings: CurveSettings, inputs: CurveInputs, sites: list, pool: list[str]):
        self.model, self.settings, self.inputs, self.sites, self.pool = model, settings, inputs, sites, pool
        self.shape = {s.name: s.num_heads for s in sites}
        self.groups, self.rule = kv_groups(model), HeadRule(settings.gqa, settings.min_per_site)
        self.fixed_scores: dict[str, torch.Tensor] | None = None
        self.planned: dict = {}  # the Fisher and the calibration batches, for all Fisher orders

    def lowest(self, scores, n: int) -> dict[str, list[int]]:
        """The n lowest-scored heads of the pool, as the GQA mode allows."""
        return select_gqa(scores, self.groups, Budget.of(n_drop=n), self.rule)

    def at(self, order: str, seed: int, n: int, dropped: dict) -> tuple[dict, dict | None]:
        """(heads dropped, tuned mask or None) by ``order`` at ``n`` pruned; ``dropped``: its previous step's."""
        if order == "importance":
            if self.fixed_scores is None:
                self.fixed_scores = self.inputs.importance(None)
            return self.lowest(_pool(self.fixed_scores, self.pool), n), None
        if order == "importance-iterative":
            scores = self.inputs.importance(mask_from_heads(self.sites, dropped) if dropped else None)
            return _grow(dropped, n, scores, self.pool, self.lowest), None
        if order == "oracle":
            return self.lowest(_pool(self.inputs.oracle, self.pool), n), None
        if order in PLANNED:
            return _planned(self.model, order, n, self.pool, self.shape, self.settings, self.inputs.calibration,
                            self.planned)
        return _random_drop(self.shape, self.pool, n, seed, self.lowest), None


def _interval(model, evaluator, result, base_result: list) -> dict:
    """{ci_low, ci_high, p_value} of ``result`` against the unpruned model (evaluated once, kept in base_result)."""
    from ..evaluation.significance import compare

    if not base_result:
        base_result.append(evaluator.evaluate(model))
    test = compare(base_result[0], result, n_resamples=1000, seed=0)
    return {"ci_low": test["ci_low"], "ci_high": test["ci_high"], "p_value": test["p_value"]}


CURVE_ALPHA = 0.05  # the level of each curve point's test; its interval is the 95% one


def no_significant_loss(summary: list[dict], alpha: float = CURVE_ALPHA) -> dict[str, dict]:
    """Per order with a test at each step: the largest pruned share up to which no step is significantly
    worse than the unpruned model (two-sided p < alpha, score lower). Each step is tested on its own,
    unadjusted: that finds a loss more readily, so the claim "no loss up to X" is the harder one to make.

    Per order: {"share": X (None when the first pruned step already loses), "first_loss": the share
    where a loss is first significant (None: none), "ci_at_share": the interval of the change at X,
    "relative_low_at_share": the worst relative quality that interval allows (a non-significance is not
    an equivalence: losses up to there are not excluded), "alpha", "steps"}. Orders averaged over
    seeds carry no per-step test and are left out.
    """
    out = {}
    for order in dict.fromkeys(r["order"] for r in summary):
        rows = sorted((r for r in summary if r["order"] == order), key=lambda r: r["fraction"])
        if any(r.get("p_value") is None for r in rows if r["pruned"] > 0):
            continue
        base = next((r for r in rows if r["pruned"] == 0), None)
        if base is None:
            continue
        share, first_loss, at = None, None, base
        for r in rows:
            if r["pruned"] == 0:
                share, at = 0.0, r
                continue
            if r["p_value"] < alpha and r["relative"] < 1:
                first_loss = r["pruned"] / r["of"]
                break
            share, at = r["pruned"] / r["of"], r
        out[order] = {"share": share, "first_loss": first_loss, "alpha": alpha,
                      "ci_at_share": [at.get("ci_low"), at.get("ci_high")] if at is not base else [0.0, 0.0],
                      "relative_low_at_share": _relative_low(base["score"], at),
                      "steps": sum(r["pruned"] > 0 for r in rows),
                      "test": "each step's paired test against the unpruned model, unadjusted"}
    return out


def _relative_low(base: float, row: dict) -> float | None:
    """The worst relative quality (score / unpruned, or unpruned / score when lower is better) the step's
    interval allows; None without an interval."""
    low, high = row.get("ci_low"), row.get("ci_high")
    if low is None or high is None or not base:
        return None
    down, up = base + low, base + high
    if row["relative"] and row["score"] and abs(row["relative"] - row["score"] / base) < 1e-9:  # higher is better
        return down / base
    return base / up if up > 0 else 0.0


def summarize(rows: list[dict]) -> list[dict]:
    """Mean and std over seeds per (order, step): the table the plot draws (with the 95% interval of the
    change from unpruned where one seed was run and the rows carry it)."""
    out = []
    has_ci = any("ci_low" in r for r in rows)
    for order in dict.fromkeys(r["order"] for r in rows):
        for step in sorted({r["step"] for r in rows if r["order"] == order}):
            group = [r for r in rows if r["order"] == order and r["step"] == step]
            scores = np.array([r["score"] for r in group])
            out.append({"order": order, "step": step, "fraction": group[0]["fraction"],
                        "pruned": group[0]["pruned"], "of": group[0]["of"], "score": float(scores.mean()),
                        "std": float(scores.std()) if len(scores) > 1 else 0.0, "seeds": len(group),
                        "relative": float(np.mean([r["relative"] for r in group]))})
            if has_ci:  # None for steps averaged over seeds (or resumed from a run without intervals)
                one = group[0] if len(group) == 1 else {}
                out[-1].update({k: one.get(k) for k in ("ci_low", "ci_high", "p_value")})
    return out


def _pool(scores: Mapping[str, torch.Tensor], pool: list[str]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(scores[k], dtype=torch.float64) for k in pool}


def _grow(dropped, n, scores, pool, lowest) -> dict[str, list[int]]:
    """Keep what is dropped (scored -inf, so chosen first) and add the lowest-scored others up to n."""
    forced = {k: torch.as_tensor(scores[k], dtype=torch.float64).clone() for k in pool}
    for k, heads in dropped.items():
        forced[k][heads] = float("-inf")
    return lowest(forced, max(n, sum(len(v) for v in dropped.values())))


def _planned(model, order, n, pool, shape, settings, calibration, cache) -> tuple[dict, dict | None]:
    """Heads dropped by a Fisher order at ``n`` pruned (and its tuned mask, or None)."""
    if "fisher" not in cache:
        cache["batches"] = list(calibration())
        cache["fisher"] = score_heads(model, cache["batches"], "fisher")
    min_per_site = settings.min_per_site
    floor = sum(min(min_per_site, shape[k]) for k in pool)  # as lowest_heads: keep min_per_site when asked for more
    n_keep = max(sum(shape[k] for k in pool) - n, floor)
    compensate = order.split("+")[1] if "+" in order else "none"  # the order's name: fisher[+rearrange|+tune]
    prune = PruneSettings(n_keep=max(n_keep, 1), scores="fisher", compensate=compensate, min_per_site=min_per_site,
                          gqa=settings.gqa)  # n_keep below replaces the budget (0 at the last step)
    plan = plan_heads(model, cache["batches"], prune, n_keep=n_keep, scored=cache["fisher"],
                      sites=pool if len(pool) < len(shape) else None)
    return plan.drop, (plan.mask(model) if plan.scales is not None else None)


def _random_drop(shape: dict[str, int], pool: list[str], n: int, seed: int, lowest) -> dict[str, list[int]]:
    """A fixed random order of the pool's heads per seed; the first n are dropped (curves nest)."""
    rng = random.Random(seed)
    scores = {k: torch.tensor([rng.random() for _ in range(shape[k])], dtype=torch.float64) for k in pool}
    return lowest(scores, n)
