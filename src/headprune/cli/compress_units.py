"""``headprune compress --units neurons|both``: heads and FFN neurons under one budget, reconstruction
guarded on validation data (the library's :func:`headprune.compression.units.compress_pool`).

headprune compress MODEL_DIR --task classification --data dev.tsv --calib-data train.tsv --units both \\
    --share 0.5 -o OUT
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import ConfigError
from .app import echo_headline
from .compress_common import check_inputs, signature, with_seq_len
from .dataflags import in_cli_terms
from .options import TaskSetup, show_progress


def compress_pool_command(prune, *, model_dir: Path, task: str, data: str, data2, calib_data, calib_data2,
                          calib_split, calib_limit, allow_same_data: bool, bench_batch: int, bench_repeats: int,
                          no_bench: bool, output: Path, quiet: bool, progress: bool, verify: bool, val_data, val_data2,
                          val_split, val_limit, fit_limit, seq_len_given: bool, flags, compensate_flag: str):
    """``headprune compress`` when :class:`~headprune.compression.PruneSettings` ``prune`` is not the head plan
    (neurons, both, a params / latency price, reconstruct, distillation). ``compensate_flag``: how the
    compensation was asked for, as the user typed it (for messages)."""
    from ..evaluation.data import same_data
    from ..experiments.compress_units import run_compress_units

    settings = prune.unit_settings()
    price = settings.price
    calib, calib_split = check_inputs(output=output, data=data, calib_data=calib_data, calib_data2=calib_data2,
                                      calib_split=calib_split, split=flags.split, allow_same_data=allow_same_data,
                                      calib_limit=calib_limit, bench_batch=bench_batch, bench_repeats=bench_repeats,
                                      no_bench=no_bench, more=(val_data,))
    if val_data is not None and (same_data(val_data, data) and val_split == flags.split):
        raise ConfigError(f"--val-data {val_data!r} is the evaluation data --data; allowed: a disjoint file or split")
    if val_data is not None and same_data(val_data, calib) and val_split == calib_split:
        raise ConfigError(f"--val-data {val_data!r} is the calibration data; allowed: a disjoint file or split "
                          "(or leave --val-data out: part of the calibration batches is held out)")
    if val_limit is not None and (isinstance(val_limit, bool) or val_limit < 1):
        raise ConfigError(f"--val-limit {val_limit}; allowed: an integer >= 1")
    if fit_limit is not None and (isinstance(fit_limit, bool) or fit_limit < 1):
        raise ConfigError(f"--fit-limit {fit_limit}; allowed: an integer >= 1")
    if fit_limit is not None and val_data is None:
        raise ConfigError(f"--fit-limit {fit_limit} without --val-data: the guard's validation part would be held out "
                          "of calibration examples the fit also reads; allowed: give --val-data (disjoint data)")
    if fit_limit is not None and not settings.compensate.endswith("reconstruct") and not settings.distill_epochs:
        raise ConfigError(f"--fit-limit with {compensate_flag}; allowed: only with a reconstruction (--compensate "
                          "reconstruct, bias+reconstruct or linear+reconstruct) or --distill-epochs")
    bars = show_progress(quiet, progress)
    t = TaskSetup(model_dir, task, flags)
    model, tok = t.model, t.tokenizer
    settings = with_seq_len(settings, None if not seq_len_given else settings.seq_len, model)
    ev = t.on(data, data2)
    calib_ev = t.on(calib, calib_data2 if calib_data else data2, limit=calib_limit, flag="--calib-data", split=calib_split)
    prices = table = None
    if price == "latency":
        from ..bench.unit_latency import latency_prices, latency_table

        table = latency_table(model, batch=bench_batch, seq_len=settings.seq_len, tgt_len=settings.tgt_len,
                              repeats=bench_repeats)
        prices = latency_prices(model, table)
    fit = None
    if fit_limit is not None:
        fit = list(t.on(calib, calib_data2 if calib_data else data2, limit=fit_limit, flag="--calib-data",
                        split=calib_split).batches())
    val = None
    if val_data is not None:
        val = list(t.on(val_data, val_data2, limit=val_limit, flag="--val-data", split=val_split).batches())
    sig = {**signature(model_dir=model_dir, task=task, data=data, data2=data2, calib=calib, calib_data=calib_data,
                       calib_data2=calib_data2, calib_split=calib_split, calib_limit=calib_limit, flags=flags, ev=ev,
                       calib_ev=calib_ev, files={"--val-data": val_data, "--val-data2": val_data2}),
           "val_data": val_data or "held-out part of --calib-data", "val_split": val_split, "val_limit": val_limit,
           "fit_limit": fit_limit}
    with in_cli_terms("--calib-data"):  # e.g. too few calibration batches to hold out a validation part
        report, summary = run_compress_units(model, tok, ev, list(calib_ev.batches()), output, settings=settings,
                                             val_batches=val, fit_batches=fit, signature=sig, prices=prices,
                                             latency_table=table,
                                             bench_batch=None if no_bench else bench_batch, bench_repeats=bench_repeats,
                                             verify=verify, progress=bars)
    echo_headline(output)
    typer.echo(f"compressed {model_dir} -> {output}: {summary}; report: {report}")
