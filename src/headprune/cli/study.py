"""The paper's experiments as commands; each writes a run directory with results and report.html.

headprune ablate | all-but-one | cross-domain | curve | dynamics | report
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer

from ..errors import ConfigError
from ..provenance import data_sha256, own_name
from .app import app, echo_headline, friendly
from .dataflags import in_cli_terms, split_option
from .identity import content_sha256, identity
from .options import (
    DATA,
    DATA2,
    FRESH,
    GQA,
    MINSITE,
    OUT,
    QUIET,
    TASK,
    SweepFlags,
    TaskFlags,
    TaskSetup,
    calib_limit_option,
    check_calib_limit,
    check_checkpoint,
    comma_list,
    with_flags,
)

MODEL = typer.Argument(..., help="A Hugging Face model directory (or one written by headprune), or a .gguf file.")


def run_signature(model_dir: Path, task: str, data: str, data2, evaluator, seed: int, flags: TaskFlags) -> dict:
    chosen = getattr(evaluator, "signature", {}).get("split")  # a datasets directory's split, when given
    return {"model": own_name(model_dir), "task": task, "data": [data] + ([str(data2)] if data2 else []),
            "split": Path(data).name, **({"data_split": chosen} if chosen else {}), "n": len(evaluator),
            "seed": seed, **identity(flags, evaluator, model_dir, {"--data": data, "--data2": data2}),
            "command": " ".join(sys.argv[1:])}


@app.command("ablate")
@friendly
@with_flags(flags=TaskFlags, sweep=SweepFlags)
def ablate(model_dir: Path = MODEL, task: str = TASK, data: str = DATA, data2: Path = DATA2,
           output: Path = OUT, fresh: bool = FRESH, quiet: bool = QUIET, *, flags: TaskFlags, sweep: SweepFlags):
    """One head masked at a time, with significance (paper 3.2, Table 1, Fig. 1)."""
    from ..experiments.rundir import RunOutput
    from ..experiments.study import run_ablation

    settings = sweep.settings()
    t = TaskSetup(model_dir, task, flags, quiet)
    ev = t.on(data, data2)
    with in_cli_terms():  # e.g. n_resamples too few for the sweep: named as --resamples
        out = RunOutput(output, run_signature(model_dir, task, data, data2, ev, sweep.seed, flags), fresh=fresh,
                        progress=not quiet)
        report = run_ablation(t.model, ev, out, sites=sweep.site_list(), settings=settings)
    echo_headline(output, report)


@app.command("all-but-one")
@friendly
@with_flags(flags=TaskFlags, sweep=SweepFlags)
def all_but_one(model_dir: Path = MODEL, task: str = TASK, data: str = DATA, data2: Path = DATA2,
                choose_data: str = typer.Option(None, "--choose-data", help="Choose the kept head on this split "
                                                "(paper App. A; default: none, on --data itself); the score is "
                                                "reported on --data."),
                choose_data2: Path = typer.Option(None, "--choose-data2", help="Translation: target of --choose-data (default: none)."),
                choose_split: str = split_option("--choose-data", "; without --choose-data: this split of --data"),
                calib_limit: int = calib_limit_option("--choose-data", "the split the kept head is chosen on"),
                output: Path = OUT, fresh: bool = FRESH, quiet: bool = QUIET, *, flags: TaskFlags, sweep: SweepFlags):
    """Keep only one head per site, try each, report the best (paper 3.3, Tables 2-3; App. A, Tables 5-6)."""
    from ..experiments.rundir import RunOutput
    from ..experiments.study import run_all_but_one

    settings = sweep.settings()
    check_calib_limit(calib_limit)
    if choose_data2 is not None and choose_data is None:
        raise ConfigError("--choose-data2 needs --choose-data")
    t = TaskSetup(model_dir, task, flags, quiet)
    ev = t.on(data, data2)
    choose = (t.on(choose_data or data, choose_data2 if choose_data else data2, limit=calib_limit,
                   flag="--choose-data", split=choose_split) if choose_data or choose_split else None)
    sig = run_signature(model_dir, task, data, data2, ev, sweep.seed, flags)
    if choose is not None:
        sig.update(choose_data=choose_data or data, choose_n=len(choose), calib_limit=calib_limit)
        sig["data_sha256"].update({"--choose-data": content_sha256(choose_data or data),
                                   **({"--choose-data2": content_sha256(choose_data2)} if choose_data2 else {})})
        if choose_split:
            sig.update(choose_split=choose_split)
    with in_cli_terms():  # e.g. n_resamples too few for the sweep: named as --resamples
        report = run_all_but_one(t.model, ev, RunOutput(output, sig, fresh=fresh, progress=not quiet),
                                 choose_on=choose, sites=sweep.site_list(), settings=settings)
    echo_headline(output, report)


@app.command("cross-domain")
@friendly
@with_flags(flags=TaskFlags, sweep=SweepFlags)
def cross_domain(model_dir: Path = MODEL, task: str = TASK, data: str = DATA, data2: Path = DATA2,
                 data_b: str = typer.Option(..., "--data-b", help="The second dataset (e.g. out-of-domain), evaluated like --data: --limit takes its first N examples too."),
                 data2_b: Path = typer.Option(None, "--data2-b", help="Translation: target of --data-b (default: none)."),
                 split_b: str = split_option("--data-b"),
                 names: str = typer.Option("in-domain,out-of-domain", "--names", help="Names of the two datasets."),
                 output: Path = OUT, fresh: bool = FRESH, quiet: bool = QUIET, *, flags: TaskFlags, sweep: SweepFlags):
    """One-head ablation on two datasets and the Pearson r of the score changes (paper 3.4, Fig. 2)."""
    from ..experiments.rundir import RunOutput
    from ..experiments.study import run_cross_domain

    pair = tuple(n.strip() for n in names.split(","))
    if len(pair) != 2 or not all(pair):
        raise ConfigError(f"--names {names!r}; allowed: two comma-separated names")
    settings = sweep.settings()
    t = TaskSetup(model_dir, task, flags, quiet)
    ev_a = t.on(data, data2)
    ev_b = t.on(data_b, data2_b, flag="--data-b", split=split_b)
    sig = {**run_signature(model_dir, task, data, data2, ev_a, sweep.seed, flags), "data_b": data_b, "n_b": len(ev_b),
           **({"split_b": split_b} if split_b else {})}
    sig["data_sha256"].update({"--data-b": content_sha256(data_b),
                               **({"--data2-b": content_sha256(data2_b)} if data2_b else {})})
    with in_cli_terms():  # e.g. n_resamples too few for the sweep: named as --resamples
        report = run_cross_domain(t.model, ev_a, ev_b, RunOutput(output, sig, fresh=fresh, progress=not quiet),
                                  names=pair, sites=sweep.site_list(), settings=settings)
    echo_headline(output, report)


def _curve_settings(orders: str, step: float, seeds: int, kinds: str | None, min_per_site: int, gqa: str = "uniform"):
    from ..experiments.curves import CurveSettings

    if not 0 < step <= 1:
        raise ConfigError(f"--step {step}; allowed: 0 < step <= 1")
    n = int(round(1 / step))
    fractions = sorted({min(1.0, round(i * step, 6)) for i in range(n + 1)} | {1.0})
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}; allowed: >= 1")
    with in_cli_terms():
        return CurveSettings(fractions=tuple(fractions), orders=tuple(o.strip() for o in orders.split(",")),
                             seeds=tuple(range(seeds)), kinds=tuple(comma_list(kinds)) if kinds else None,
                             min_per_site=min_per_site, gqa=gqa)


ORDERS = typer.Option("importance,oracle,random", "--orders", help="Comma-separated: importance, "
                      "importance-iterative, oracle, random, fisher, fisher+rearrange, fisher+tune (Fisher orders "
                      "score and tune on --calib-data).")
STEP = typer.Option(0.1, "--step", help="Share of heads pruned per step.")
SEEDS = typer.Option(3, "--seeds", help="Random order: number of seeds.")
KINDS = typer.Option(None, "--kind", help="Prune only this attention kind: encoder, decoder, cross (paper Fig. 4; "
                     "default: all kinds).")


@app.command("curve")
@friendly
@with_flags(flags=TaskFlags)
def curve(model_dir: Path = MODEL, task: str = TASK, data: str = DATA, data2: Path = DATA2,
          calib_data: str = typer.Option(None, "--calib-data", help="Data for I_h and the Fisher orders (default: "
                                         "the evaluated --data examples)."),
          calib_data2: Path = typer.Option(None, "--calib-data2", help="Translation: target of --calib-data (default: none)."),
          calib_split: str = split_option("--calib-data", "; without --calib-data: this split of --data"),
          calib_limit: int = calib_limit_option("--calib-data", "for I_h and the Fisher orders"),
          oracle_from: Path = typer.Option(None, "--oracle-from", help="Take the oracle order from this "
                                           "`headprune ablate` run directory (default: none, computed here by a one-head ablation)."),
          orders: str = ORDERS, step: float = STEP, seeds: int = SEEDS, kind: str = KINDS, min_per_site: int = MINSITE,
          output: Path = OUT, fresh: bool = FRESH, gqa: str = GQA, quiet: bool = QUIET, *, flags: TaskFlags):
    """Pruning curves in I_h, oracle and random order (paper 4.2, 5, App. B; Figs. 3, 4, 6)."""
    from ..experiments.rundir import RunOutput
    from ..experiments.study import oracle_from_run, run_curves

    if gqa not in ("uniform", "groups", "free"):
        raise ConfigError(f"--gqa {gqa!r}; allowed: uniform, groups, free")
    settings = _curve_settings(orders, step, seeds, kind, min_per_site, gqa)
    check_calib_limit(calib_limit)
    if calib_data2 is not None and calib_data is None:
        raise ConfigError("--calib-data2 needs --calib-data")
    oracle = oracle_from_run(oracle_from) if oracle_from and "oracle" in settings.orders else None
    t = TaskSetup(model_dir, task, flags, quiet)
    ev = t.on(data, data2)
    calib = (t.on(calib_data or data, calib_data2 if calib_data else data2, limit=calib_limit, flag="--calib-data",
                  split=calib_split) if calib_data or calib_split else ev)
    sig = {**run_signature(model_dir, task, data, data2, ev, 0, flags), "importance_data": calib_data or data,
           **({"importance_split": calib_split} if calib_split else {}),
           "importance_n": len(calib), "calib_limit": calib_limit, "oracle_from": str(oracle_from) if oracle else None,
           "oracle_sha256": data_sha256(Path(oracle_from) / "ablation.csv") if oracle else None}
    sig["data_sha256"].update({k: content_sha256(v) for k, v in (("--calib-data", calib_data),
                                                               ("--calib-data2", calib_data2)) if v})
    report = run_curves(t.model, ev, RunOutput(output, sig, fresh=fresh, progress=not quiet), settings=settings,
                        importance_batches=calib.batches, oracle=oracle)
    echo_headline(output, report)


@app.command("dynamics")
@friendly
@with_flags(flags=TaskFlags)
def dynamics(checkpoints: list[Path] = typer.Argument(..., help="Per-epoch checkpoint directories (epoch-1 ...)."),
             task: str = TASK, data: str = DATA, data2: Path = DATA2,
             calib_data: str = typer.Option(None, "--calib-data", help="Data I_h is scored on at every epoch (the "
                                            "paper: training data; default: none, the evaluated --data examples "
                                            "themselves, which the run then records)."),
             calib_data2: Path = typer.Option(None, "--calib-data2", help="Translation: target of --calib-data (default: none)."),
             calib_split: str = split_option("--calib-data", "; without --calib-data: this split of --data"),
             calib_limit: int = calib_limit_option("--calib-data", "for I_h"),
             step: float = STEP, kind: str = KINDS,
             output: Path = OUT, fresh: bool = FRESH, quiet: bool = QUIET, *, flags: TaskFlags):
    """The I_h pruning curve at every epoch, relative to that epoch's unpruned model (paper 6, Fig. 5)."""
    from ..experiments.rundir import RunOutput
    from ..experiments.study import run_dynamics

    settings = _curve_settings("importance", step, 1, kind, 0)
    check_calib_limit(calib_limit)
    if calib_data2 is not None and calib_data is None:
        raise ConfigError("--calib-data2 needs --calib-data")
    separate = bool(calib_data or calib_split)
    for path in checkpoints:
        if not (path / "config.json").is_file():
            raise ConfigError(f"checkpoint {str(path)!r} is not a model directory (no config.json)")
    epochs = [_epoch(p, i) for i, p in enumerate(checkpoints, start=1)]
    order = sorted(zip(epochs, checkpoints, strict=True))
    def calibration(t: TaskSetup):
        if not separate:
            return None
        return t.on(calib_data or data, calib_data2 if calib_data else data2, limit=calib_limit, flag="--calib-data",
                    split=calib_split)

    first = TaskSetup(order[0][1], task, flags, quiet)  # checked, and its data read, before anything is written
    ready = {order[0][1]: (first.model, first.on(data, data2), calibration(first))}
    del first
    for _, path in order[1:]:
        check_checkpoint(path, task)  # from config.json alone: the weights load when their epoch comes

    def loader(path):
        def load():
            if path in ready:
                return ready.pop(path)
            t = TaskSetup(path, task, flags, quiet)
            return t.model, t.on(data, data2), calibration(t)
        return load

    sig = {"model": [own_name(p) for p in checkpoints], "task": task, "data": data, "split": Path(data).name,
           **({"data_split": flags.split} if flags.split else {}),
           "n": flags.limit, "seed": 0,
           **identity(flags, ready[order[0][1]][1], list(checkpoints), {"--data": data, "--data2": data2}),
           "importance_data": (calib_data or data) if separate else f"{data} (the evaluated examples themselves)",
           **({"importance_split": calib_split} if calib_split else {}),
           **({"importance_n": len(ready[order[0][1]][2]), "calib_limit": calib_limit} if separate else {}),
           "command": " ".join(sys.argv[1:])}
    sig["data_sha256"].update({k: content_sha256(v) for k, v in (("--calib-data", calib_data),
                                                               ("--calib-data2", calib_data2)) if v})
    report = run_dynamics([(e, loader(p)) for e, p in order], RunOutput(output, sig, fresh=fresh, progress=not quiet),
                          settings=settings)
    echo_headline(output, report)


def _epoch(path: Path, position: int) -> int:
    match = re.search(r"(\d+)$", path.name.rstrip("/"))
    return int(match.group(1)) if match else position


@app.command("report")
@friendly
def report(run_dir: Path = typer.Argument(..., help="A run directory written by a headprune command.")):
    """(Re)build report.html of a run directory from its results.json and figures."""
    from ..report import build_report

    echo_headline(run_dir, build_report(run_dir))
