"""``headprune compress``: prune a model to a head or FLOP budget (Kwon et al. 2022 on heads) and save it.

headprune compress MODEL_DIR --task classification --data dev.tsv --calib-data train.tsv --keep 0.5 -o OUT
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from ..errors import ConfigError
from .app import app, echo_headline, friendly
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
    check_calib_limit,
    show_progress,
    with_flags,
)

DEFAULT_SEQ_LEN = 128
METHOD_HELP = ("ih (the paper's I_h), fisher (diagonal Fisher), fisher+rearrange (+ per-site swaps), "
               "fisher+tune (+ least-squares scales folded into the weights), random.")


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
    from ..evaluation.data import same_data
    from ..experiments.compress import run_compress

    budgets = {f: v for f, v in (("--keep", keep), ("--keep-heads", keep_heads), ("--flops", flops), ("--kv", kv))
               if v is not None}
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
    settings = CompressSettings(keep=keep, n_keep=keep_heads, flops=flops, method=method, min_per_site=min_per_site,
                                seq_len=seq_len or 8, tgt_len=tgt_len, damping=damping, target=tune_target,
                                guard=not no_guard, seed=seed, gqa=gqa, kv=kv,
                                same_per_site=same_per_site)  # checks all
    if output.exists():
        raise ConfigError(f"--output {str(output)!r} already exists; choose a new directory")
    calib = calib_data or data
    calib_split = flags.split if calib_split is None and calib_data is None else calib_split
    if same_data(data, calib) and calib_split == flags.split and not allow_same_data:
        raise ConfigError(f"--calib-data {calib!r} is the evaluation data --data; calibrating on it overstates the "
                          "result; allowed: a disjoint file or split (e.g. a train split; --calib-split for a datasets "
                          "directory), or --allow-same-data")
    if calib_data2 is not None and calib_data is None:
        raise ConfigError("--calib-data2 needs --calib-data")
    check_calib_limit(calib_limit)
    bars = show_progress(quiet, progress)
    if not no_bench and (bench_batch < 1 or bench_repeats < 1):
        raise ConfigError(f"--bench-batch {bench_batch} --bench-repeats {bench_repeats}; allowed: integers >= 1")
    for path in [p for p in (data, calib) if not str(p).startswith("builtin:")]:
        if not Path(path).exists():
            raise ConfigError(f"data file {path!r} does not exist")
    t = TaskSetup(model_dir, task, flags)
    model, tok = t.model, t.tokenizer
    if seq_len is None:  # 128 tokens, or what the position table allows
        limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
        settings = replace(settings, seq_len=min(DEFAULT_SEQ_LEN, limit or DEFAULT_SEQ_LEN))
    ev = t.on(data, data2)
    calib_ev = t.on(calib, calib_data2 if calib_data else data2, limit=calib_limit, flag="--calib-data",
                    split=calib_split)
    signature = {"model": str(model_dir), "task": task, "data": [data] + ([str(data2)] if data2 else []),
                 "split": Path(data).name, "n": len(ev),
                 **{k: v for k, v in (("data_split", flags.split), ("calib_split", calib_split)) if v},
                 "calib_data": [calib] + ([str(calib_data2 or data2)] if (calib_data2 or data2) else []),
                 "calib_n": len(calib_ev)}
    report = run_compress(model, tok, ev, list(calib_ev.batches()), output, settings=settings, signature=signature,
                          bench_batch=None if no_bench else bench_batch, bench_repeats=bench_repeats,
                          verify=not trust_unverified, progress=bars)
    echo_headline(output)
    typer.echo(f"compressed {model_dir} -> {output}; report: {report}")
