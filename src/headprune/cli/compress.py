"""``headprune compress``: prune heads, FFN neurons or both to one budget and save the smaller model.

headprune compress MODEL_DIR --task classification --data dev.tsv --calib-data train.tsv --share 0.5 -o OUT

A thin layer over :func:`headprune.compression.compress`: the flags are :class:`PruneSettings`'s fields
(:mod:`.compress_flags`, with the former flags translated), the head plan runs here, the budget over heads
and neurons in :mod:`.compress_units`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import ConfigError
from .app import app, echo_headline, friendly
from .compress_common import DEFAULT_SEQ_LEN, check_inputs, signature, with_seq_len
from .compress_flags import in_setting_terms
from .dataflags import split_option
from .options import (
    DATA,
    DATA2,
    GQA,
    MINSITE,
    PROGRESS,
    QUIET,
    TASK,
    TaskFlags,
    TaskSetup,
    calib_limit_option,
    show_progress,
    with_flags,
)


@app.command("compress")
@friendly
@with_flags(flags=TaskFlags)
def compress_command(
    model_dir: Path = typer.Argument(..., help="A Hugging Face model directory (or one written by headprune), or a .gguf file."),
    task: str = TASK, data: str = DATA, data2: Path = DATA2,
    calib_data: str = typer.Option(None, "--calib-data", help="Calibration data for scores and tuning (default: "
                                   "--data, refused unless --allow-same-data): must not overlap --data."),
    calib_data2: Path = typer.Option(None, "--calib-data2", help="Translation: target file of --calib-data "
                                     "(default: none)."),
    calib_split: str = split_option("--calib-data", "; without --calib-data: this split of --data"),
    calib_limit: int = calib_limit_option("--calib-data", "for scores and tuning"),
    allow_same_data: bool = typer.Option(False, "--allow-same-data", help="Allow calibrating on the evaluation data."),
    units: str = typer.Option("heads", "--units", help="What to prune: heads, neurons (FFN) or both, under one budget."),
    share: float = typer.Option(None, "--share", help="Budget: the share of the units' --price kept, in (0, 1]; "
                                "required: exactly one of --share, --n-keep."),
    n_keep: int = typer.Option(None, "--n-keep", help="Budget: the number of heads kept (or --share: one is "
                                "required)."),
    price: str = typer.Option(None, "--price", help="What --share measures: count (units), flops (at --seq-len; the "
                              "default), params, kv (KV-cache bytes per token; drops whole key/value groups) or latency "
                              "(a table timed once on this machine at --bench-batch, --seq-len)."),
    scores: str = typer.Option(None, "--scores", help="How units are scored: ih (the paper's I_h), fisher (diagonal "
                               "Fisher of the mask; the default), random, fluctuation (FLAP: the variance of each "
                               "unit's input times its output weights, one forward pass, no labels; standardised per "
                               "kind over all layers) or fluctuation-raw (the same, not standardised: heads and "
                               "neurons traded by price)."),
    compensate: str = typer.Option(None, "--compensate", help="How the loss of what is cut is made up for: none, "
                                   "rearrange (Fisher swaps per site), tune (+ least-squares head scales folded into "
                                   "the weights; the default for heads), reconstruct (least-squares refit of every "
                                   "pruned projection, kept only if the validation loss drops; the default with "
                                   "neurons), bias (removed units held at their calibration means, folded into the "
                                   "output projections' biases; the default with --scores fluctuation*), linear "
                                   "(removed units replaced by their least-squares affine prediction from the kept "
                                   "ones, folded into the kept columns and the biases; same single pass), "
                                   "bias+reconstruct or linear+reconstruct."),
    gqa: str = GQA,
    same_per_site: bool = typer.Option(False, "--same-per-site", help="Keep the same number of heads in every site "
                                       "(with --gqa uniform or groups, a head budget): the saved model then has a "
                                       "stock config that plain from_pretrained loads."),
    min_per_site: int = MINSITE,
    seq_len: int = typer.Option(None, "--seq-len", help=f"Tokens per example for FLOPs and timing (default "
                                f"{DEFAULT_SEQ_LEN}, at most the model's positions)."),
    tgt_len: int = typer.Option(None, "--tgt-len", help="Encoder-decoders: decoder tokens (default: --seq-len)."),
    damping: float = typer.Option(1e-2, "--damping", help="tune / reconstruct: ridge towards the unpruned solution "
                                  "(relative); linear: ridge towards the mean stand-in (relative to the kept "
                                  "features' mean variance)."),
    max_scale: float = typer.Option(10.0, "--max-scale", help="tune: scales outside [-max, max] are refused (unit "
                                    "scales kept)."),
    target: str = typer.Option(None, "--target", help="tune / reconstruct: what each site reproduces: residual (the "
                               "stream after it, Kwon et al.; the default) or output (its projection's)."),
    no_guard: bool = typer.Option(False, "--no-guard", help="Keep rearrangement, tuning and reconstruction even where "
                                  "they raise the calibration / validation loss."),
    val_share: float = typer.Option(0.25, "--val-share", help="reconstruct without --val-data: the share of the "
                                    "calibration batches held out (spread over their lengths) for the guard."),
    bench_batch: int = typer.Option(16, "--bench-batch", help="Batch size of the speed measurement."),
    bench_repeats: int = typer.Option(5, "--bench-repeats", help="Timed rounds of the speed measurement."),
    no_bench: bool = typer.Option(False, "--no-bench", help="Skip the speed measurement."),
    seed: int = typer.Option(0, "--seed", help="Seed of --scores random and of the distillation order."),
    multiple_of: int = typer.Option(1, "--multiple-of", help="Every FFN width and attention width (heads x "
                                    "head_dim) pruning changes is a multiple of N: 32 / 256 for llama.cpp's Q4_0 / "
                                    "Q8_0 and K-quant blocks, 64 / 128 for GPU tiles (the budget over heads and "
                                    "neurons; default 1: any width)."),
    val_data: str = typer.Option(None, "--val-data", help="reconstruct: validation data for its guard, disjoint from "
                                 "--calib-data and --data (default: --val-share of the calibration batches, spread "
                                 "over their lengths, is held out)."),
    val_data2: Path = typer.Option(None, "--val-data2", help="Translation: target file of --val-data (default: none)."),
    val_split: str = split_option("--val-data"),
    val_limit: int = typer.Option(None, "--val-limit", help="First N examples of --val-data (default: all)."),
    fit_limit: int = typer.Option(None, "--fit-limit", help="reconstruct: fit on the first N examples of the "
                                  "calibration data (labels unused; more than --calib-limit overfits less); needs "
                                  "--val-data (default: the --calib-limit examples)."),
    distill_epochs: int = typer.Option(0, "--distill-epochs", help="After the reconstruction, train the pruned model "
                                       "for N passes over the fit examples to match the unpruned model's outputs (no "
                                       "labels read; kept only if it lowers the validation loss; default 0: off)."),
    distill_lr: float = typer.Option(2e-5, "--distill-lr", help="--distill-epochs: peak learning rate (AdamW, linear "
                                     "decay to 0)."),
    output: Path = typer.Option(..., "-o", "--output", help="New directory: the pruned model, compress.json, "
                                "report.html."),
    quiet: bool = QUIET,
    progress: bool = PROGRESS,
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the check that surgery is exact for this model's "
                                   "class (refused families): check the result yourself."),
    keep: float = typer.Option(None, "--keep", hidden=True, help="Deprecated: --share (--price count for heads)."),
    keep_heads: int = typer.Option(None, "--keep-heads", hidden=True, help="Deprecated: --n-keep."),
    flops: float = typer.Option(None, "--flops", hidden=True, help="Deprecated: --share with --price flops."),
    kv: float = typer.Option(None, "--kv", hidden=True, help="Deprecated: --share with --price kv."),
    method: str = typer.Option(None, "--method", hidden=True, help="Deprecated: --scores and --compensate."),
    tune_target: str = typer.Option(None, "--tune-target", hidden=True, help="Deprecated: --target."),
    trust_unverified: bool = typer.Option(False, "--trust-unverified", hidden=True, help="Deprecated: --no-verify."),
    *, flags: TaskFlags,
):
    """Prune heads, FFN neurons or both to one budget (a share of their count, FLOPs, parameters, KV cache or
    latency, or a count), compensate, and save the smaller model."""
    from ..compression.compress import check_head_count
    from ..compression.settings import PruneSettings
    from ..experiments.compress import run_compress
    from .compress_flags import settings_from_flags, settings_from_former

    if tune_target is not None and target is not None:
        raise ConfigError("--tune-target and --target both given; allowed: --target (--tune-target is its former name)")
    common = {"gqa": gqa, "same_per_site": same_per_site, "min_per_site": min_per_site,
              "seq_len": DEFAULT_SEQ_LEN if seq_len is None else seq_len, "tgt_len": tgt_len, "damping": damping,
              "max_scale": max_scale, "target": target or tune_target or "residual", "guard": not no_guard,
              "val_share": val_share, "distill_epochs": distill_epochs, "distill_lr": distill_lr, "seed": seed,
              "multiple_of": multiple_of}
    former_given = [f for f, v in (("--keep", keep), ("--keep-heads", keep_heads), ("--flops", flops), ("--kv", kv),
                                   ("--method", method)) if v is not None]
    if former_given:
        new_given = [f for f, v in (("--share", share), ("--n-keep", n_keep), ("--scores", scores),
                                    ("--compensate", compensate)) if v is not None]
        if new_given:
            raise ConfigError(f"{former_given[0]} with {new_given[0]}; allowed: --share / --n-keep, --price, --scores, "
                              f"--compensate ({former_given[0]} is a former flag)")
        translated = settings_from_former(units=units, keep=keep, keep_heads=keep_heads, flops=flops, kv=kv,
                                          method=method, price=price,
                                          pool_inputs=val_data is not None or fit_limit is not None or distill_epochs > 0,
                                          common=common)
    else:
        translated = settings_from_flags(units=units, share=share, n_keep=n_keep, price=price, scores=scores,
                                         compensate=compensate, common=common)
    translated.former += [(f, new) for f, given, new in (("--tune-target", tune_target is not None, "--target"),
                                                         ("--trust-unverified", trust_unverified, "--no-verify"))
                          if given]
    settings: PruneSettings = translated.settings
    verify = not (no_verify or trust_unverified)
    if not settings.head_plan:
        from .compress_units import compress_pool_command

        compress_pool_command(settings, model_dir=model_dir, task=task, data=data, data2=data2, calib_data=calib_data,
                              calib_data2=calib_data2, calib_split=calib_split, calib_limit=calib_limit,
                              allow_same_data=allow_same_data, bench_batch=bench_batch, bench_repeats=bench_repeats,
                              no_bench=no_bench, output=output, quiet=quiet, progress=progress, verify=verify,
                              val_data=val_data, val_data2=val_data2, val_split=val_split, val_limit=val_limit,
                              fit_limit=fit_limit, seq_len_given=seq_len is not None, flags=flags,
                              compensate_flag=f"--method {method}" if method else
                              f"--compensate {settings.compensate}")
        _former_lines(translated)
        return
    unused = [f for f, given in (("--val-data", val_data is not None), ("--fit-limit", fit_limit is not None))
              if given]
    if unused:
        raise ConfigError(f"{unused[0]} with --compensate {settings.compensate}; allowed: only with --compensate "
                          "reconstruct (or --units neurons|both)")
    heads = settings.heads_settings()
    calib, calib_split = check_inputs(output=output, data=data, calib_data=calib_data, calib_data2=calib_data2,
                         calib_split=calib_split, split=flags.split, allow_same_data=allow_same_data,
                         calib_limit=calib_limit, bench_batch=bench_batch, bench_repeats=bench_repeats,
                         no_bench=no_bench)
    bars = show_progress(quiet, progress)
    t = TaskSetup(model_dir, task, flags)
    model, tok = t.model, t.tokenizer
    try:  # a count above the model's heads: refused before any data is read, naming the flag given
        with in_setting_terms():
            check_head_count(model, heads.n_keep, None)
    except ConfigError as err:
        raise ConfigError(str(err).replace("--n-keep", "--keep-heads") if keep_heads is not None else str(err)) from err
    heads = with_seq_len(heads, seq_len, model)
    ev = t.on(data, data2)
    calib_ev = t.on(calib, calib_data2 if calib_data else data2, limit=calib_limit, flag="--calib-data",
                    split=calib_split)
    sig = signature(model_dir=model_dir, task=task, data=data, data2=data2, calib=calib, calib_data=calib_data,
                    calib_data2=calib_data2, calib_split=calib_split, calib_limit=calib_limit, flags=flags, ev=ev,
                    calib_ev=calib_ev)
    report = run_compress(model, tok, ev, list(calib_ev.batches()), output, settings=heads, signature=sig,
                          bench_batch=None if no_bench else bench_batch, bench_repeats=bench_repeats,
                          verify=verify, progress=bars)
    echo_headline(output)
    typer.echo(f"compressed {model_dir} -> {output}; report: {report}")
    _former_lines(translated)


def _former_lines(translated) -> None:
    """One stderr line per former flag used, after the command has finished (a refusal stays one line)."""
    for line in translated.lines():
        typer.echo(line, err=True)
