"""The paper's experiments as commands; each writes a run directory with results and report.html.

headprune ablate | all-but-one | cross-domain | curve | dynamics | report
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer

from ..cli import app, friendly
from ..errors import ConfigError

TASK = typer.Option(..., "--task", help="classification, translation or lm.")
DATA = typer.Option(..., "--data", help="Data file (TSV/CSV/JSONL/datasets dir; translation: source file or table; "
                    "lm: text file or 'builtin:pydoc').")
DATA2 = typer.Option(None, "--data2", help="Translation: target file, line-aligned with --data.")
TEXT = typer.Option(None, "--text-column", help="Classification text column (name or position).")
PAIR = typer.Option(None, "--text-pair-column", help="Second text column of pair tasks.")
LABEL = typer.Option(None, "--label-column", help="Classification label column.")
SRC = typer.Option(None, "--source-column", help="Translation table: source column.")
TGT = typer.Option(None, "--target-column", help="Translation table: target column.")
LIMIT = typer.Option(None, "--limit", help="Only the first N examples (lm: N blocks).")
BATCH = typer.Option(None, "--batch-size", help="Batch size.")
METRIC = typer.Option(None, "--metric", help="Classification: accuracy (default), f1, matthews.")
BEAMS = typer.Option(1, "--beams", help="Translation: beam size (1 = greedy).")
SITES = typer.Option(None, "--sites", help="Comma-separated site names or kinds (encoder, decoder, cross).")
ALPHA = typer.Option(0.01, "--alpha", help="Significance level for the flag.")
RESAMPLES = typer.Option(1000, "--resamples", help="Bootstrap resamples.")
SEED = typer.Option(0, "--seed", help="Seed (bootstrap, random order).")
OUT = typer.Option(..., "-o", "--output", help="Run directory (rerun the same command to resume).")
FRESH = typer.Option(False, "--fresh", help="Start over in an existing run directory.")


def _columns(text, pair, label, src, tgt) -> dict:
    from .evaluate import _column

    return {"text_column": _column(text), "text_pair_column": _column(pair), "label_column": _column(label),
            "source_column": _column(src), "target_column": _column(tgt)}


def _evaluator(model, tokenizer, task: str, data: str, data2, columns: dict, limit, batch_size, metric, beams):
    from .evaluate import TASKS, build_task

    if task not in TASKS:
        raise ConfigError(f"--task {task!r}; allowed: {', '.join(TASKS)}")
    return build_task(task, tokenizer, model.config, data=data, data2=data2, columns=columns, limit=limit,
                      batch_size=batch_size, metric=metric, max_length=None, beams=beams, max_new_tokens=None,
                      block_size=128, split=None)


def _load(model_dir: Path):
    from ..loading import load_model, load_tokenizer

    model = load_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        raise ConfigError(f"model directory {str(model_dir)!r} has no tokenizer files; save one beside the model")
    return model, tokenizer


class _Task:
    """A loaded model and the task flags shared by every study command; ``on(data)`` builds an evaluator."""

    def __init__(self, model_dir: Path, task: str, text_column, text_pair_column, label_column, source_column,
                 target_column, limit, batch_size, metric, beams):
        self.model, self.tokenizer = _load(model_dir)
        self.task, self.limit, self.batch_size, self.metric, self.beams = task, limit, batch_size, metric, beams
        self.columns = _columns(text_column, text_pair_column, label_column, source_column, target_column)

    def on(self, data: str, data2=None):
        return _evaluator(self.model, self.tokenizer, self.task, data, data2, self.columns, self.limit,
                          self.batch_size, self.metric, self.beams)


def _signature(model_dir: Path, task: str, data: str, data2, evaluator, seed: int) -> dict:
    return {"model": str(model_dir), "task": task, "data": [data] + ([str(data2)] if data2 else []),
            "split": Path(data).name, "n": len(evaluator), "seed": seed, "command": " ".join(sys.argv[1:])}


def _sites(value: str | None):
    return None if not value else [s.strip() for s in value.split(",") if s.strip()]


def _settings(alpha, resamples, seed):
    from ..ablation import SweepSettings

    return SweepSettings(alpha=alpha, n_resamples=resamples, seed=seed)


@app.command("ablate")
@friendly
def ablate(model_dir: Path = typer.Argument(...), task: str = TASK, data: str = DATA, data2: Path = DATA2,
           text_column: str = TEXT, text_pair_column: str = PAIR, label_column: str = LABEL,
           source_column: str = SRC, target_column: str = TGT, limit: int = LIMIT, batch_size: int = BATCH,
           metric: str = METRIC, beams: int = BEAMS, sites: str = SITES, alpha: float = ALPHA,
           resamples: int = RESAMPLES, seed: int = SEED, output: Path = OUT, fresh: bool = FRESH):
    """One head masked at a time, with significance (paper 3.2, Table 1, Fig. 1)."""
    from ..study import run_ablation

    settings = _settings(alpha, resamples, seed)
    t = _Task(model_dir, task, text_column, text_pair_column, label_column, source_column, target_column, limit,
              batch_size, metric, beams)
    model = t.model
    ev = t.on(data, data2)
    report = run_ablation(model, ev, output, signature=_signature(model_dir, task, data, data2, ev, seed),
                          sites=_sites(sites), settings=settings, fresh=fresh)
    typer.echo(f"report: {report}")


@app.command("all-but-one")
@friendly
def all_but_one(model_dir: Path = typer.Argument(...), task: str = TASK, data: str = DATA, data2: Path = DATA2,
                choose_data: str = typer.Option(None, "--choose-data", help="Choose the kept head on this split "
                                                "(paper App. A); the score is reported on --data."),
                choose_data2: Path = typer.Option(None, "--choose-data2", help="Translation: target of --choose-data."),
                text_column: str = TEXT, text_pair_column: str = PAIR, label_column: str = LABEL,
                source_column: str = SRC, target_column: str = TGT, limit: int = LIMIT, batch_size: int = BATCH,
                metric: str = METRIC, beams: int = BEAMS, sites: str = SITES, alpha: float = ALPHA,
                resamples: int = RESAMPLES, seed: int = SEED, output: Path = OUT, fresh: bool = FRESH):
    """Keep only one head per site, try each, report the best (paper 3.3, Tables 2-3; App. A, Tables 5-6)."""
    from ..study import run_all_but_one

    settings = _settings(alpha, resamples, seed)
    t = _Task(model_dir, task, text_column, text_pair_column, label_column, source_column, target_column, limit,
              batch_size, metric, beams)
    model = t.model
    ev = t.on(data, data2)
    choose = t.on(choose_data, choose_data2) \
        if choose_data else None
    sig = _signature(model_dir, task, data, data2, ev, seed)
    if choose_data:
        sig["choose_data"] = choose_data
    report = run_all_but_one(model, ev, output, choose_on=choose, signature=sig, sites=_sites(sites),
                             settings=settings, fresh=fresh)
    typer.echo(f"report: {report}")


@app.command("cross-domain")
@friendly
def cross_domain(model_dir: Path = typer.Argument(...), task: str = TASK, data: str = DATA, data2: Path = DATA2,
                 data_b: str = typer.Option(..., "--data-b", help="The second dataset (e.g. out-of-domain)."),
                 data2_b: Path = typer.Option(None, "--data2-b", help="Translation: target of --data-b."),
                 names: str = typer.Option("in-domain,out-of-domain", "--names", help="Names of the two datasets."),
                 text_column: str = TEXT, text_pair_column: str = PAIR, label_column: str = LABEL,
                 source_column: str = SRC, target_column: str = TGT, limit: int = LIMIT, batch_size: int = BATCH,
                 metric: str = METRIC, beams: int = BEAMS, sites: str = SITES, alpha: float = ALPHA,
                 resamples: int = RESAMPLES, seed: int = SEED, output: Path = OUT, fresh: bool = FRESH):
    """One-head ablation on two datasets and the Pearson r of the score changes (paper 3.4, Fig. 2)."""
    from ..study import run_cross_domain

    pair = tuple(n.strip() for n in names.split(","))
    if len(pair) != 2 or not all(pair):
        raise ConfigError(f"--names {names!r}; allowed: two comma-separated names")
    settings = _settings(alpha, resamples, seed)
    t = _Task(model_dir, task, text_column, text_pair_column, label_column, source_column, target_column, limit,
              batch_size, metric, beams)
    model = t.model
    ev_a = t.on(data, data2)
    ev_b = t.on(data_b, data2_b)
    sig = {**_signature(model_dir, task, data, data2, ev_a, seed), "data_b": data_b, "n_b": len(ev_b)}
    report = run_cross_domain(model, ev_a, ev_b, output, names=pair, signature=sig, sites=_sites(sites),
                              settings=settings, fresh=fresh)
    typer.echo(f"report: {report}")


def _curve_settings(orders: str, step: float, seeds: int, kinds: str | None, min_per_site: int):
    from ..curves import CurveSettings

    if not 0 < step <= 1:
        raise ConfigError(f"--step {step}; allowed: 0 < step <= 1")
    n = int(round(1 / step))
    fractions = sorted({min(1.0, round(i * step, 6)) for i in range(n + 1)} | {1.0})
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}; allowed: >= 1")
    return CurveSettings(fractions=tuple(fractions), orders=tuple(o.strip() for o in orders.split(",")),
                         seeds=tuple(range(seeds)), kinds=tuple(_sites(kinds)) if kinds else None,
                         min_per_site=min_per_site)


ORDERS = typer.Option("importance,oracle,random", "--orders", help="Comma-separated: importance, "
                      "importance-iterative, oracle, random, fisher, fisher+rearrange, fisher+tune (Fisher orders "
                      "score and tune on --calib-data).")
STEP = typer.Option(0.1, "--step", help="Share of heads pruned per step.")
SEEDS = typer.Option(3, "--seeds", help="Random order: number of seeds.")
KINDS = typer.Option(None, "--kind", help="Prune only this attention kind: encoder, decoder, cross (paper Fig. 4).")
MINSITE = typer.Option(0, "--min-per-site", help="Keep at least this many heads in every site.")


@app.command("curve")
@friendly
def curve(model_dir: Path = typer.Argument(...), task: str = TASK, data: str = DATA, data2: Path = DATA2,
          calib_data: str = typer.Option(None, "--calib-data", help="Data for I_h (default: --data)."),
          calib_data2: Path = typer.Option(None, "--calib-data2", help="Translation: target of --calib-data."),
          oracle_from: Path = typer.Option(None, "--oracle-from", help="Take the oracle order from this "
                                           "`headprune ablate` run directory instead of recomputing it."),
          orders: str = ORDERS, step: float = STEP, seeds: int = SEEDS, kind: str = KINDS, min_per_site: int = MINSITE,
          text_column: str = TEXT, text_pair_column: str = PAIR, label_column: str = LABEL,
          source_column: str = SRC, target_column: str = TGT, limit: int = LIMIT, batch_size: int = BATCH,
          metric: str = METRIC, beams: int = BEAMS, output: Path = OUT, fresh: bool = FRESH):
    """Pruning curves in I_h, oracle and random order (paper 4.2, 5, App. B; Figs. 3, 4, 6)."""
    from ..study import oracle_from_run, run_curves

    settings = _curve_settings(orders, step, seeds, kind, min_per_site)
    oracle = oracle_from_run(oracle_from) if oracle_from and "oracle" in settings.orders else None
    t = _Task(model_dir, task, text_column, text_pair_column, label_column, source_column, target_column, limit,
              batch_size, metric, beams)
    model = t.model
    ev = t.on(data, data2)
    calib = t.on(calib_data, calib_data2) \
        if calib_data else ev
    sig = {**_signature(model_dir, task, data, data2, ev, 0), "importance_data": calib_data or data,
           "oracle_from": str(oracle_from) if oracle else None}
    report = run_curves(model, ev, output, settings=settings, importance_batches=calib.batches, signature=sig,
                        oracle=oracle, fresh=fresh)
    typer.echo(f"report: {report}")


@app.command("dynamics")
@friendly
def dynamics(checkpoints: list[Path] = typer.Argument(..., help="Per-epoch checkpoint directories (epoch-1 ...)."),
             task: str = TASK, data: str = DATA, data2: Path = DATA2, step: float = STEP, kind: str = KINDS,
             text_column: str = TEXT, text_pair_column: str = PAIR, label_column: str = LABEL,
             source_column: str = SRC, target_column: str = TGT, limit: int = LIMIT, batch_size: int = BATCH,
             metric: str = METRIC, beams: int = BEAMS, output: Path = OUT, fresh: bool = FRESH):
    """The I_h pruning curve at every epoch, relative to that epoch's unpruned model (paper 6, Fig. 5)."""
    from ..study import run_dynamics

    settings = _curve_settings("importance", step, 1, kind, 0)
    for path in checkpoints:
        if not (path / "config.json").is_file():
            raise ConfigError(f"checkpoint {str(path)!r} is not a model directory (no config.json)")
    epochs = [_epoch(p, i) for i, p in enumerate(checkpoints, start=1)]

    def loader(path):
        def load():
            t = _Task(path, task, text_column, text_pair_column, label_column, source_column, target_column, limit,
                      batch_size, metric, beams)
            return t.model, t.on(data, data2)
        return load

    sig = {"model": [str(p) for p in checkpoints], "task": task, "data": data, "split": Path(data).name,
           "n": limit, "seed": 0, "command": " ".join(sys.argv[1:])}
    order = sorted(zip(epochs, checkpoints, strict=True))
    report = run_dynamics([(e, loader(p)) for e, p in order], output, settings=settings, signature=sig, fresh=fresh)
    typer.echo(f"report: {report}")


def _epoch(path: Path, position: int) -> int:
    match = re.search(r"(\d+)$", path.name.rstrip("/"))
    return int(match.group(1)) if match else position


@app.command("report")
@friendly
def report(run_dir: Path = typer.Argument(..., help="A run directory written by a headprune command.")):
    """(Re)build report.html of a run directory from its results.json and figures."""
    from ..report import build_report

    typer.echo(f"report: {build_report(run_dir)}")
