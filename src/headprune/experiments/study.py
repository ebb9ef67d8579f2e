"""The paper's experiments as run directories: compute (resumably), then tables, figures, report.

Each ``run_*`` takes a model, evaluator(s) and a :class:`~.rundir.RunOutput` (the directory, the
caller's signature, ``fresh``, ``progress``), and writes ``run.json`` (the signature), ``units.jsonl``
(finished units), ``results.json``, CSV tables, PNG figures and a self-contained ``report.html``.
Rerunning the same command on the same directory resumes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError
from ..evaluation.metrics import format_score
from ..evaluation.significance import STATISTICS
from ..provenance import code_identity, versions
from ..report import build_report
from ..report import figures as fig
from ..scoring.importance import head_importance
from . import ablation
from .curves import CURVE_ALPHA, CurveInputs, CurveSettings, no_significant_loss, pruning_curves, summarize
from .rundir import RunDir, RunOutput


def _signature(signature: dict | None, method: str, settings: dict, *evaluators) -> dict:
    """The caller's signature (model, data, ...) with the method, its settings, the evaluators' own
    settings (metric, lengths, batch size, beams) and the code: what a resume must match."""
    sig = {"model": None, "data": None, "split": None, "n": None, **(signature or {})}
    sig["evaluation"] = [getattr(e, "signature", None) for e in evaluators if e is not None]
    sig.update(method=method, settings=settings, seed=settings.get("seed", 0), code=code_identity(),
               versions=versions(), statistics=STATISTICS)
    return sig


def _finish(run: RunDir, results: dict, evaluated=None) -> Path:
    """Write results.json (with sacreBLEU's signature and the generation protocol for BLEU) and report.html."""
    results.setdefault("signature", run.signature)
    extra = getattr(evaluated, "extra", None) or {}
    if "sacrebleu" in extra:
        results["bleu"] = {"sacrebleu": extra["sacrebleu"], "generation": extra.get("signature", {}).get("generation")}
    run.write_json("results.json", results)
    report = build_report(run.path)
    run.close()
    return report


P_KEYS = ("p_value", "p_ttest", "p_mcnemar", "p_bootstrap", "p_sacrebleu", "p_adjusted", "ci_low", "ci_high",
          "significant")


def _csv_rows(rows: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """``keys`` then the significance columns the rows hold (p_ttest/p_mcnemar for accuracy only,
    p_bootstrap for corpus metrics, p_sacrebleu for BLEU: beside the reported p_value, never instead)."""
    wanted = [*keys, *(k for k in P_KEYS if rows and k in rows[0])]
    return [{k: r.get(k) for k in wanted} for r in rows]


def _ablation_csv_rows(rows: list[dict]) -> list[dict]:
    return _csv_rows(rows, ("site", "kind", "layer", "head", "score", "delta", "damage"))


def _significant_label(settings: ablation.SweepSettings, n: int, what: str) -> str:
    name = {"holm": "Holm", "bh": "Benjamini-Hochberg"}[settings.correction]
    return f"significant: {name}-adjusted p < {settings.alpha} over {n} {what}"


def run_ablation(model: nn.Module, evaluator, output: RunOutput, *, sites: Iterable[str] | None = None,
                 settings: ablation.SweepSettings | None = None) -> Path:
    """Paper 3.2 (Table 1, Fig. 1): one head masked at a time, with significance."""
    settings = (settings or ablation.SweepSettings()).for_units(ablation.sweep_units(model, sites, "head"))
    run = output.open(_signature(output.signature, "one-head ablation", {**vars(settings), "sites": sites}, evaluator))
    sweep = ablation.one_head_ablation(model, evaluator, sites=sites, settings=settings, run=run,
                                       progress=output.progress)
    metric, base = sweep.base.metric, sweep.base.score
    table = run.write_csv("ablation.csv", _ablation_csv_rows(sweep.rows))
    run.write_csv("ablation_by_damage.csv", sorted(_ablation_csv_rows(sweep.rows), key=lambda r: -r["damage"]))
    fig.ablation_heatmap(sweep.rows, base, metric, run.path / "ablation_heatmap.png", settings.alpha, source=table)
    fig.ablation_histogram(sweep.rows, base, metric, run.path / "ablation_histogram.png")
    fig.record(run.path / "ablation_histogram.png", table, heads=len(sweep.rows))
    n_sig = sum(r["significant"] for r in sweep.rows)
    better = sum(r["damage"] < 0 for r in sweep.rows)
    worst = max(sweep.rows, key=lambda r: r["damage"])
    return _finish(run, {
        "title": "One head masked at a time (Michel et al. 2019, 3.2)",
        "experiment": "ablation", "metric": metric, "base": base,
        "headline": [["full model " + metric, format_score(metric, base)], ["heads", len(sweep.rows)],
                     [_significant_label(settings, len(sweep.rows), "heads"), n_sig],
                     ["masking improves the score", better],
                     [f"worst: {worst['site']} head {worst['head']}", format_score(metric, worst["score"])]],
        "rows": sweep.rows,
        "figures": [{"file": "ablation_heatmap.png", "caption": "Change of the score when each head alone is masked."},
                    {"file": "ablation_histogram.png", "caption": "Distribution of scores with one head masked; dashed: full model."}],
        "tables": [{"title": "Heads sorted by damage (most harmful to remove first)", "file": "ablation_by_damage.csv",
                    "max_rows": 20}],
    }, sweep.base)


def run_all_but_one(model: nn.Module, evaluator, output: RunOutput, *, choose_on=None,
                    sites: Iterable[str] | None = None, settings: ablation.SweepSettings | None = None) -> Path:
    """Paper 3.3 / App. A (Tables 2, 3, 5, 6): keep one head per site."""
    settings = (settings or ablation.SweepSettings()).for_units(ablation.sweep_units(model, sites, "site"))
    method = "all-but-one" + (" (head chosen on a held-out split)" if choose_on is not None else "")
    run = output.open(_signature(output.signature, method, {**vars(settings), "sites": sites}, evaluator, choose_on))
    sweep = ablation.all_but_one(model, evaluator, choose_on=choose_on, sites=sites, settings=settings, run=run,
                                 progress=output.progress)
    metric, base = sweep.base.metric, sweep.base.score
    worst = max(sweep.rows, key=lambda r: r["damage"])  # damage: the loss of quality, whichever way the metric points
    table = run.write_csv("all_but_one.csv", _csv_rows(sweep.rows, ("site", "kind", "layer", "kept_head", "chosen_on",
                                                                     "score", "delta")))
    fig.all_but_one_bars(sweep.rows, base, metric, run.path / "all_but_one.png", settings.alpha, source=table)
    return _finish(run, {
        "title": "All heads but one per layer (Michel et al. 2019, 3.3" + (", App. A)" if choose_on else ")"),
        "experiment": "all-but-one", "metric": metric, "base": base, "rows": sweep.rows,
        "headline": [["full model " + metric, format_score(metric, base)], ["sites", len(sweep.rows)],
                     [_significant_label(settings, len(sweep.rows), "sites"), sum(r["significant"] for r in sweep.rows)],
                     [f"worst: {worst['site']} keeping head {worst['kept_head']}", format_score(metric, worst["score"])]],
        "figures": [{"file": "all_but_one.png", "caption": "Score change when each site keeps only its best head."}],
        "tables": [{"title": "Per site", "file": "all_but_one.csv"}],
    }, sweep.base)


def run_cross_domain(model: nn.Module, evaluator_a, evaluator_b, output: RunOutput, *, names: tuple[str, str],
                     sites: Iterable[str] | None = None, settings: ablation.SweepSettings | None = None) -> Path:
    """Paper 3.4 (Fig. 2): one-head ablation on two datasets, Pearson r."""
    settings = (settings or ablation.SweepSettings()).for_units(ablation.sweep_units(model, sites, "head"))
    run = output.open(_signature(output.signature, "cross-domain one-head ablation",
                                 {**vars(settings), "sites": sites, "datasets": list(names)}, evaluator_a,
                                 evaluator_b))
    result = ablation.cross_domain(model, evaluator_a, evaluator_b, sites=sites, settings=settings, run=run,
                                   progress=output.progress)
    a, b = result["a"], result["b"]
    table = run.write_csv("cross_domain.csv", [
        {"site": x["site"], "head": x["head"], f"delta_{names[0]}": x["delta"], f"delta_{names[1]}": y["delta"],
         f"p_{names[0]}": x["p_value"], f"p_{names[1]}": y["p_value"],
         f"p_adjusted_{names[0]}": x["p_adjusted"], f"p_adjusted_{names[1]}": y["p_adjusted"],
         f"ci_low_{names[0]}": x["ci_low"], f"ci_high_{names[0]}": x["ci_high"],
         f"ci_low_{names[1]}": y["ci_low"], f"ci_high_{names[1]}": y["ci_high"]}
        for x, y in zip(a.rows, b.rows, strict=True)])
    metric = a.base.metric
    fig.cross_domain_scatter(a.rows, b.rows, result["pearson_r"], result["p_value"], names, metric,
                             run.path / "cross_domain.png", source=table)
    return _finish(run, {
        "title": "Are important heads the same across domains? (Michel et al. 2019, 3.4)",
        "experiment": "cross-domain", "metric": metric, "pearson_r": result["pearson_r"],
        "p_value": result["p_value"], "base": {names[0]: a.base.score, names[1]: b.base.score},
        "headline": [["Pearson r of the deltas", f"{result['pearson_r']:.3f}"], ["p-value", f"{result['p_value']:.2g}"],
                     [f"full model on {names[0]}", format_score(metric, a.base.score)],
                     [f"full model on {names[1]}", format_score(metric, b.base.score)]],
        "figures": [{"file": "cross_domain.png", "caption": "Each point is a head: score change when masked, on each dataset."}],
        "tables": [{"title": "Per head", "file": "cross_domain.csv", "max_rows": 30}],
    })


def importance_scorer(model: nn.Module, batches: Callable[[], Iterable]) -> Callable:
    """``scorer(mask) -> {site: I_h}`` over ``batches()`` (fresh iterable each call)."""
    return lambda mask: head_importance(model, batches(), mask=mask)


def run_curves(model: nn.Module, evaluator, output: RunOutput, *, settings: CurveSettings,
               importance_batches: Callable[[], Iterable] | None = None,
               sweep_settings: ablation.SweepSettings | None = None, oracle: dict | None = None,
               title: str = "") -> Path:
    """Paper 4.2 / 5 / App. B (Figs. 3, 4, 6): pruning curves by I_h, oracle and random order.

    ``oracle``: {site: damage [H]} from an earlier one-head ablation (see :func:`oracle_from_run`);
    computed here (and resumable) when not given.
    """
    if "oracle" in settings.orders and oracle is None:  # the oracle sweep's resamples, sized before the signature
        sweep_settings = (sweep_settings or ablation.SweepSettings()).for_units(
            ablation.sweep_units(model, settings.kinds, "head"))
    run = output.open(_signature(output.signature, "pruning curves", {
        "fractions": list(settings.fractions), "orders": list(settings.orders), "seeds": list(settings.seeds),
        "kinds": settings.kinds, "min_per_site": settings.min_per_site,
        "oracle_sweep": vars(sweep_settings) if sweep_settings is not None else None,
        "interval_test": {"alpha": CURVE_ALPHA, "n_resamples": 1000, "seed": 0}}, evaluator))
    if "oracle" in settings.orders and oracle is None:
        sweep = ablation.one_head_ablation(model, evaluator, sites=settings.kinds, settings=sweep_settings, run=run,
                                           unit_prefix="oracle:", progress=output.progress)
        oracle = {}
        for r in sweep.rows:
            oracle.setdefault(r["site"], {})[r["head"]] = r["damage"]
        oracle = {k: torch.tensor([v[h] for h in sorted(v)]) for k, v in oracle.items()}
    scorer = importance_scorer(model, importance_batches or evaluator.batches)
    inputs = CurveInputs(importance=scorer, oracle=oracle, calibration=importance_batches or evaluator.batches)
    rows = pruning_curves(model, evaluator, settings=settings, inputs=inputs, run=run, progress=output.progress,
                          intervals=True)
    summary = summarize(rows)
    metric = getattr(evaluator, "metric", "score")
    keys = ("order", "seed", "fraction", "pruned", "of", "score", "relative", "ci_low", "ci_high", "p_value")
    keys = tuple(k for k in keys if any(k in r for r in rows))
    run.write_csv("curves.csv", [{k: r.get(k) for k in keys} for r in rows])
    table = run.write_csv("curves_summary.csv", summary)
    kinds = f" ({', '.join(settings.kinds)} attention only)" if settings.kinds else ""
    fig.pruning_curves(summary, metric, run.path / "curves.png", title=title or f"Pruning curve{kinds}", source=table,
                       unpruned_label="unpruned, on the curve's own data")
    unpruned = next(r["score"] for r in summary if r["pruned"] == 0)
    tested = no_significant_loss(summary)
    return _finish(run, {
        "title": f"Pruning curves (Michel et al. 2019, 4.2){kinds}", "experiment": "curves", "metric": metric,
        "base": unpruned, "rows": summary, "no_significant_loss": tested,
        "headline": [["unpruned " + metric, format_score(metric, unpruned)]] + [
            [f"{o}: most pruned within 1% of unpruned (point estimate)", f"{_within(summary, o, 0.99):.0%}"]
            for o in dict.fromkeys(r["order"] for r in summary)] + [
            [f"{o}: no significant loss up to (paired test, alpha {CURVE_ALPHA}, every step)", f"{t['share']:.0%}"]
            for o, t in tested.items() if t["share"] is not None],
        "figures": [{"file": "curves.png", "caption": "Score as more heads are masked, per order; dashed: unpruned."}],
        "tables": [{"title": "Curve points (mean over seeds for random)", "file": "curves_summary.csv", "max_rows": 60}],
    })


def oracle_from_run(run_dir: str | Path) -> dict[str, torch.Tensor]:
    """{site: damage [H]} from a one-head ablation run directory (its ablation.csv)."""
    import csv


    path = Path(run_dir) / "ablation.csv"
    if not path.is_file():
        raise ConfigError(f"oracle run {str(run_dir)!r} has no ablation.csv; expected a `headprune ablate` run directory")
    damages: dict[str, dict[int, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            damages.setdefault(row["site"], {})[int(row["head"])] = float(row["damage"])
    return {site: torch.tensor([d[h] for h in sorted(d)]) for site, d in damages.items()}


def _within(summary: list[dict], order: str, level: float) -> float:
    """Largest share of heads pruned while every step so far keeps >= level of the unpruned quality."""
    best = 0.0
    for r in sorted((r for r in summary if r["order"] == order), key=lambda r: r["fraction"]):
        if r["relative"] < level:
            break
        best = r["pruned"] / r["of"]
    return best


def run_dynamics(checkpoints: list[tuple[int, Callable[[], tuple]]], output: RunOutput, *,
                 settings: CurveSettings) -> Path:
    """Paper 6 (Fig. 5): the I_h pruning curve at every epoch, relative to that epoch's unpruned model.

    ``checkpoints``: (epoch, load) pairs; ``load()`` returns (model, evaluator) or (model, evaluator,
    calibration): I_h is scored on ``calibration`` (the paper: training data), else on the evaluated
    examples themselves -- which the signature's ``importance_data`` must then say.
    """
    settings = CurveSettings(fractions=settings.fractions, orders=("importance",), seeds=(0,), kinds=settings.kinds,
                             min_per_site=settings.min_per_site)
    run = output.open(_signature(output.signature, "pruning curves across training", {
        "fractions": list(settings.fractions), "epochs": [e for e, _ in checkpoints], "kinds": settings.kinds}))
    rows, metric = [], "score"
    for epoch, load in checkpoints:  # a finished epoch costs only its loading on resume
        model, evaluator, *calibration = load()
        metric = getattr(evaluator, "metric", metric)
        scored_on = calibration[0] if calibration and calibration[0] is not None else evaluator
        curve = pruning_curves(model, evaluator, settings=settings, run=run, unit_prefix=f"epoch{epoch}:",
                               inputs=CurveInputs(importance=importance_scorer(model, scored_on.batches)),
                               progress=output.progress)
        rows += [{"epoch": epoch, "fraction": r["fraction"], "pruned": r["pruned"], "score": r["score"],
                  "relative": r["relative"]} for r in curve]
    table = run.write_csv("dynamics.csv", rows)
    fig.dynamics(rows, metric, run.path / "dynamics.png", source=table)
    scored = (output.signature or {}).get("importance_data")
    return _finish(run, {
        "title": "Pruning curves across training epochs (Michel et al. 2019, 6)", "experiment": "dynamics",
        "metric": metric, "rows": rows, "importance_data": scored,
        "notes": [f"I_h scored on {scored or 'the evaluated examples themselves'}; the paper scores it on training "
                  "data (dynamics --calib-data)."],
        "headline": [["epochs", len(checkpoints)]] + [
            [f"epoch {r['epoch']}: relative score at {r['fraction']:.0%} pruned", f"{r['relative']:.1%}"]
            for r in _near_40_percent(rows, [e for e, _ in checkpoints])],
        "figures": [{"file": "dynamics.png", "caption": "Left: relative score per pruning level over epochs. Right: early vs late curves."}],
        "tables": [{"title": "Per epoch and pruning level", "file": "dynamics.csv", "max_rows": 80}],
    })


def _near_40_percent(rows: list[dict], epochs: list[int]) -> list[dict]:
    """Per epoch, the curve point pruned closest to 40% (exactly 40% with the default --step 0.1; any --step
    has one, so the headline never reads 'nan')."""
    return [min((r for r in rows if r["epoch"] == e), key=lambda r: (abs(r["fraction"] - 0.4), r["fraction"]))
            for e in epochs]
