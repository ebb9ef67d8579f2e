"""The paper's ablation experiments (3.2-3.4): one head off, all but one head off, two domains.

Every sweep records the unmasked model's block outputs once (that pass is also the baseline) and
evaluates each mask with the blocks below the masked site replayed (:mod:`headprune.experiments.prefix_cache`).
Each finished unit is appended to the run directory, so an interrupted sweep resumes.

Columns: ``score`` with the mask; ``delta = score - base`` (the paper's tables); ``damage`` = how
much worse the model gets (``base - score`` when higher is better, ``score - base`` for perplexity),
so a small damage means an unimportant head whatever the metric.

Significance (:func:`headprune.evaluation.significance.compare`): ``p_value`` is the raw two-sided
p of the reported test (accuracy: McNemar mid-p; perplexity: sign-flip permutation; BLEU, F1,
Matthews: paired approximate randomization), ``ci_low``/``ci_high`` the 95% interval of ``delta`` from
the same test, ``p_adjusted`` the p adjusted over the whole sweep (Holm by default, Benjamini-Hochberg
with ``correction='bh'``), and ``significant`` means ``p_adjusted < alpha``. The number of resamples
is sized for the sweep (:meth:`SweepSettings.for_units`): m units at alpha need m / (B + 1) < alpha.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..core.model.sites import Site, find_sites
from ..distributed import local, map_units
from ..errors import ConfigError
from ..evaluation.base import EvalResult
from ..evaluation.multiplicity import adjust_rows, check_correction
from ..evaluation.significance import compare, pearson, resamples_for
from ..progress import progress_bar
from .prefix_cache import PrefixCache
from .prefix_stream import recorder, replay
from .rundir import RunDir


@dataclass
class SweepSettings:
    alpha: float = 0.01  # significance level for the flag (the paper: p < 0.01)
    n_resamples: int | None = None  # None: sized for the sweep (resamples_for); too few for it is refused
    seed: int = 0
    prefix_cache: bool | str = True  # "stream": hold one layer's input, not every block's outputs (.prefix_stream)
    correction: str = "holm"  # multiplicity control over the sweep: 'holm' (family-wise) or 'bh' (FDR)

    def __post_init__(self):
        check_correction(self.correction)
        if self.prefix_cache not in (True, False, "stream"):
            raise ConfigError(f"prefix_cache={self.prefix_cache!r}; allowed: True, False, 'stream'")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"alpha={self.alpha}; allowed: 0 < alpha < 1")
        if self.n_resamples is not None and (isinstance(self.n_resamples, bool) or
                                             not isinstance(self.n_resamples, int) or self.n_resamples < 1):
            raise ConfigError(f"n_resamples={self.n_resamples!r}; allowed: an int >= 1, or None (sized for the sweep)")

    def for_units(self, m: int) -> SweepSettings:
        """These settings for a sweep of m tests: n_resamples chosen (None) or checked against the minimum
        with which one unit can be significant after adjustment (m / (B + 1) < alpha)."""
        return replace(self, n_resamples=resamples_for(m, self.alpha, self.n_resamples))


@dataclass
class Sweep:
    base: EvalResult
    rows: list[dict] = field(default_factory=list)


def select_sites(model: nn.Module, sites: Iterable[str] | None = None) -> list[Site]:
    """Sites by name or by kind (``encoder``, ``decoder``, ``cross``); all when None."""
    all_sites = find_sites(model)
    if sites is None:
        return all_sites
    wanted = list(sites)
    names = {s.name for s in all_sites}
    kinds = {s.kind for s in all_sites}
    bad = [w for w in wanted if w not in names and w not in kinds]
    if bad:
        raise ConfigError(f"sites: unknown {bad}; allowed: kinds {sorted(kinds)} or names {sorted(names)}")
    return [s for s in all_sites if s.name in wanted or s.kind in wanted]


def damage(base: EvalResult, score: float) -> float:
    return base.score - score if base.higher_is_better else score - base.score


class _Evaluations:
    """Baseline + masked evaluations of one evaluator, with the prefix cache when allowed."""

    def __init__(self, model, evaluator, sites: list[Site], settings: SweepSettings, progress: bool):
        self.model, self.evaluator, self.settings = model, evaluator, settings
        replay_decoder = not getattr(evaluator, "uses_generate", False)
        self.cache: PrefixCache | None = None
        with local():  # every rank holds the full baseline (and its prefix cache) for the units it runs
            self._baseline(model, evaluator, settings, progress, replay_decoder)

    def _baseline(self, model, evaluator, settings: SweepSettings, progress: bool, replay_decoder: bool) -> None:
        if settings.prefix_cache:
            with recorder(settings.prefix_cache)(model, find_sites(model), decoder_replay=replay_decoder) as cache:
                self.base = evaluator.evaluate(model, progress=progress)
            self.cache = cache
        else:
            self.base = evaluator.evaluate(model, progress=progress)

    def score(self, site: Site, mask, *, test: bool = True) -> tuple[EvalResult, dict | None]:
        context = replay(self.cache, site, self.evaluator) if self.cache is not None else nullcontext()
        with context:
            result = self.evaluator.evaluate(self.model, mask)
        if not test:
            return result, None
        return result, compare(self.base, result, n_resamples=self.settings.n_resamples, seed=self.settings.seed)


TEST_KEYS = ("p_value", "p_ttest", "p_mcnemar", "p_bootstrap", "p_sacrebleu", "ci_low", "ci_high", "test")


def _row(site: Site, base: EvalResult, result: EvalResult, test: dict, **extra) -> dict:
    """One unit's row; ``p_adjusted`` and ``significant`` are added over the whole sweep (:func:`adjust_rows`)."""
    return {"site": site.name, "kind": site.kind, "layer": site.layer, **extra, "score": result.score,
            "delta": result.score - base.score, "damage": damage(base, result.score),
            **{k: test[k] for k in TEST_KEYS if k in test}}


def _stored(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("unit", "p_adjusted", "significant")}


def one_head_ablation(model: nn.Module, evaluator, *, sites: Iterable[str] | None = None,
                      settings: SweepSettings | None = None, run: RunDir | None = None,
                      unit_prefix: str = "", progress: bool = True) -> Sweep:
    """Score with each head masked alone (paper 3.2, Table 1): one row per head."""
    chosen = select_sites(model, sites)
    settings = (settings or SweepSettings()).for_units(sum(s.num_heads for s in chosen))
    evals = _Evaluations(model, evaluator, chosen, settings, progress=False)
    sweep = Sweep(evals.base)
    units = {f"{unit_prefix}{s.name}:{h}": (s, h) for s in chosen for h in range(s.num_heads)}
    bar = progress_bar(total=len(units), desc="one-head ablation", unit="head", show=progress)

    def compute(key: str) -> list[tuple[str, dict]]:
        site, head = units[key]
        result, test = evals.score(site, {site.name: _one_hot(site.num_heads, head, off=True)})
        bar.update()
        return [(key, _row(site, evals.base, result, test, head=head))]

    rows = map_units(list(units), compute, run)  # each head once, on one rank under torchrun
    bar.close()
    sweep.rows = [_stored(rows[key]) for key in units]
    evals.cache = None
    adjust_rows(sweep.rows, settings.correction, settings.alpha)
    return sweep


def all_but_one(model: nn.Module, evaluator, *, choose_on=None, sites: Iterable[str] | None = None,
                settings: SweepSettings | None = None, run: RunDir | None = None,
                progress: bool = True) -> Sweep:
    """Per site keep one head (try each), report the best (paper 3.3, Tables 2-3).

    With ``choose_on`` (another evaluator, e.g. a dev split), the kept head is chosen there and the
    score reported on ``evaluator`` (App. A, Tables 5-6). One row per site.
    """
    chosen = select_sites(model, sites)
    settings = (settings or SweepSettings()).for_units(len(chosen))
    report = _Evaluations(model, evaluator, chosen, settings, progress=False)
    choose = report if choose_on is None else _Evaluations(model, choose_on, chosen, settings, progress=False)
    sweep = Sweep(report.base)
    units = {f"{site.name}:all-but-one": site for site in chosen}
    bar = progress_bar(total=len(units), desc="all-but-one", unit="site", show=progress)

    def compute(key: str) -> list[tuple[str, dict]]:
        site = units[key]
        tried = [choose.score(site, {site.name: _one_hot(site.num_heads, h, off=False)}, test=False)[0].score
                 for h in range(site.num_heads)]
        best = min(range(site.num_heads), key=lambda h: (damage(choose.base, tried[h]), h))
        result, test = report.score(site, {site.name: _one_hot(site.num_heads, best, off=False)})
        bar.update()
        return [(key, _row(site, report.base, result, test, kept_head=best,
                           chosen_on="held-out" if choose_on is not None else "same", choice_scores=tried))]

    rows = map_units(list(units), compute, run)  # each site once, on one rank under torchrun
    bar.close()
    sweep.rows = [_stored(rows[key]) for key in units]
    adjust_rows(sweep.rows, settings.correction, settings.alpha)
    return sweep


def cross_domain(model: nn.Module, evaluator_a, evaluator_b, *, sites: Iterable[str] | None = None,
                 settings: SweepSettings | None = None, run: RunDir | None = None,
                 progress: bool = True) -> dict:
    """One-head ablation on two datasets and the Pearson r of the scores (paper 3.4, Fig. 2)."""
    a = one_head_ablation(model, evaluator_a, sites=sites, settings=settings, run=run, unit_prefix="a:",
                          progress=progress)
    b = one_head_ablation(model, evaluator_b, sites=sites, settings=settings, run=run, unit_prefix="b:",
                          progress=progress)
    r = pearson([row["delta"] for row in a.rows], [row["delta"] for row in b.rows])
    return {"a": a, "b": b, "pearson_r": r.r, "p_value": r.p_value, "n": r.n}


def sweep_units(model: nn.Module, sites: Iterable[str] | None, per: str) -> int:
    """How many tests a sweep makes: heads (``per='head'``) or sites (``per='site'``) of the chosen sites."""
    chosen = select_sites(model, sites)
    return sum(s.num_heads for s in chosen) if per == "head" else len(chosen)


def _one_hot(num_heads: int, head: int, *, off: bool) -> torch.Tensor:
    """[H] mask: ones with a zero at ``head`` (off=True), or zeros with a one there (off=False)."""
    mask = torch.ones(num_heads) if off else torch.zeros(num_heads)
    mask[head] = 0.0 if off else 1.0
    return mask

