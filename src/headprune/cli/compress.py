"""``headprune compress``: prune a model to a head or FLOP budget (Kwon et al. 2022 on heads) and save it.

headprune compress MODEL_DIR --task classification --data dev.tsv --calib-data train.tsv --keep 0.5 -o OUT
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import ConfigError
from .app import app, echo_headline, friendly
from .compress_common import DEFAULT_SEQ_LEN, check_inputs, signature, with_seq_len
from .dataflags import in_cli_terms, split_option
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

METHOD_HELP = ("ih (the paper's I_h), fisher (diagonal Fisher), fisher+rearrange (+ per-site swaps), "
               "fisher+tune (+ least-squares scales folded into the weights), random; fisher+reconstruct (least-squares "
               "refit of every pruned projection, kept if the validation loss drops; the --units path).")


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
    keep: float = typer.Option(None, "--keep", help="Share of heads to keep (0..1); required: exactly one of "
                               "--keep, --keep-heads, --flops."),
    keep_heads: int = typer.Option(None, "--keep-heads", help="Number of heads to keep (or --keep, --flops: one "
                                   "is required)."),
    flops: float = typer.Option(None, "--flops", help="Share of the attention heads' FLOPs to keep, 0..1 (or --keep, "
                                "--keep-heads: one is required)."),
    kv: float = typer.Option(None, "--kv", help="Share of the KV-cache bytes per token to keep, 0..1 (drops whole "
                             "key/value groups; one of --keep, --keep-heads, --flops, --kv is required)."),
    gqa: str = GQA,
    same_per_site: bool = typer.Option(False, "--same-per-site", help="Keep the same number of heads in every site "
                                       "(with --gqa uniform or groups, a head budget): the saved model then has a "
                                       "stock config that plain from_pretrained loads."),
    method: str = typer.Option("fisher+tune", "--method", help=METHOD_HELP),
    min_per_site: int = MINSITE,
    seq_len: int = typer.Option(None, "--seq-len", help=f"Tokens per example for FLOPs and timing (default "
                                f"{DEFAULT_SEQ_LEN}, at most the model's positions)."),
    tgt_len: int = typer.Option(None, "--tgt-len", help="Encoder-decoders: decoder tokens (default: --seq-len)."),
    damping: float = typer.Option(1e-2, "--damping", help="fisher+tune: ridge towards unit scales (relative)."),
    tune_target: str = typer.Option("residual", "--tune-target", help="fisher+tune: what each site reproduces: "
                                    "residual (the stream after it, Kwon et al.) or output (its projection's)."),
    no_guard: bool = typer.Option(False, "--no-guard", help="Keep rearrangement and tuning even where they raise "
                                  "the calibration loss."),
    bench_batch: int = typer.Option(16, "--bench-batch", help="Batch size of the speed measurement."),
    bench_repeats: int = typer.Option(5, "--bench-repeats", help="Timed rounds of the speed measurement."),
    no_bench: bool = typer.Option(False, "--no-bench", help="Skip the speed measurement."),
    seed: int = typer.Option(0, "--seed", help="Seed of --method random."),
    units: str = typer.Option("heads", "--units", help="What to prune: heads, neurons (FFN) or both, under one budget "
                              "(--keep or --flops: share of their price kept)."),
    price: str = typer.Option("flops", "--price", help="--units neurons|both: price of a unit, flops (at --seq-len), "
                              "params, or latency (a table timed once on this machine at --bench-batch, --seq-len)."),
    val_data: str = typer.Option(None, "--val-data", help="--units neurons|both: validation data for the guard of "
                                 "the reconstruction, disjoint from --calib-data and --data (default: a quarter of the "
                                 "calibration batches, spread over their lengths, is held out)."),
    val_data2: Path = typer.Option(None, "--val-data2", help="Translation: target file of --val-data (default: none)."),
    val_split: str = split_option("--val-data"),
    val_limit: int = typer.Option(None, "--val-limit", help="First N examples of --val-data (default: all)."),
    fit_limit: int = typer.Option(None, "--fit-limit", help="--units neurons|both: fit the reconstruction on the first "
                                  "N examples of the calibration data (labels unused; more than --calib-limit overfits "
                                  "less); needs --val-data (default: the --calib-limit examples)."),
    distill_epochs: int = typer.Option(0, "--distill-epochs", help="--units neurons|both: after the reconstruction, "
                                       "train the pruned model for N passes over the fit examples to match the "
                                       "unpruned model's outputs (no labels read; kept only if it lowers the "
                                       "validation loss; default 0: off)."),
    distill_lr: float = typer.Option(2e-5, "--distill-lr", help="--distill-epochs: peak learning rate (AdamW, linear "
                                     "decay to 0)."),
    output: Path = typer.Option(..., "-o", "--output", help="New directory: the pruned model, compress.json, "
                                "report.html."),
    quiet: bool = QUIET,
    progress: bool = PROGRESS,
    trust_unverified: bool = typer.Option(False, "--trust-unverified", help="Skip the check that surgery is exact "
                                          "for this model's class (refused families): check the result yourself."),
    *, flags: TaskFlags,
):
    """Prune to a budget with I_h or Fisher scores (+ rearrangement, + tuned scales) and save the smaller model."""
    from ..compression.plan import CompressSettings
    from ..experiments.compress import run_compress

    budgets = {f: v for f, v in (("--keep", keep), ("--keep-heads", keep_heads), ("--flops", flops), ("--kv", kv))
               if v is not None}
    if units != "heads" or price != "flops" or val_data is not None or method == "fisher+reconstruct" or \
            fit_limit is not None or distill_epochs:
        from .compress_units import compress_units_command

        heads_only = [f for f, given in (("--kv", kv is not None), ("--same-per-site", same_per_site),
                                         ("--min-per-site", min_per_site != 0)) if given]
        if heads_only:
            raise ConfigError(f"{heads_only[0]} with --units {units} / --price {price} / --val-data / --method "
                              f"{method}; allowed: only on the heads-only path (--units heads, --price flops, no "
                              "--val-data, no --method fisher+reconstruct)")
        return compress_units_command(**{k: v for k, v in locals().items() if k not in ("budgets", "compress_units_command")})
    if len(budgets) != 1:
        raise ConfigError(f"give exactly one budget of --keep (share of heads), --keep-heads (number of heads), "
                          f"--flops (share of head FLOPs) or --kv (share of KV-cache bytes); got "
                          f"{', '.join(budgets) or 'none'}")
    if kv is not None and not (0.0 <= kv <= 1.0):
        raise ConfigError(f"--kv {kv}; allowed: a share 0..1 of the KV-cache bytes per token")
    if gqa not in ("uniform", "groups", "free"):
        raise ConfigError(f"--gqa {gqa!r}; allowed: uniform, groups, free")
    if same_per_site and (gqa == "free" or flops is not None or kv is not None):
        raise ConfigError(f"--same-per-site with --gqa {gqa} and {', '.join(budgets)}; allowed: --gqa uniform or "
                          "groups with --keep or --keep-heads")
    with in_cli_terms():  # checks all, in flag names
        settings = CompressSettings(keep=keep, n_keep=keep_heads, flops=flops, method=method,
                                    min_per_site=min_per_site, seq_len=DEFAULT_SEQ_LEN if seq_len is None else seq_len,
                                    tgt_len=tgt_len, damping=damping, target=tune_target, guard=not no_guard, seed=seed,
                                    gqa=gqa, kv=kv, same_per_site=same_per_site)
    calib, calib_split = check_inputs(output=output, data=data, calib_data=calib_data, calib_data2=calib_data2,
                         calib_split=calib_split, split=flags.split, allow_same_data=allow_same_data,
                         calib_limit=calib_limit, bench_batch=bench_batch, bench_repeats=bench_repeats,
                         no_bench=no_bench)
    bars = show_progress(quiet, progress)
    t = TaskSetup(model_dir, task, flags)
    model, tok = t.model, t.tokenizer
    settings = with_seq_len(settings, seq_len, model)
    ev = t.on(data, data2)
    calib_ev = t.on(calib, calib_data2 if calib_data else data2, limit=calib_limit, flag="--calib-data",
                    split=calib_split)
    sig = signature(model_dir=model_dir, task=task, data=data, data2=data2, calib=calib, calib_data=calib_data,
                    calib_data2=calib_data2, calib_split=calib_split, calib_limit=calib_limit, flags=flags, ev=ev,
                    calib_ev=calib_ev)
    report = run_compress(model, tok, ev, list(calib_ev.batches()), output, settings=settings, signature=sig,
                          bench_batch=None if no_bench else bench_batch, bench_repeats=bench_repeats,
                          verify=not trust_unverified, progress=bars)
    echo_headline(output)
    typer.echo(f"compressed {model_dir} -> {output}; report: {report}")
