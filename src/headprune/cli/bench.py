"""``headprune bench``: examples/s and latency of models (and pruned or masked copies) vs the FLOP limit."""

from __future__ import annotations

import copy
import json
import shlex
import sys
from pathlib import Path

import typer

from ..bench.settings import PRUNE_ORDERS, BenchSettings
from ..errors import ConfigError
from ..progress import note
from .app import app, friendly
from .options import DEVICE, QUIET, device_dtype

_D = BenchSettings()  # flag defaults are the library's


@app.command("bench")
@friendly
def bench(
    model_dirs: list[Path] = typer.Argument(..., help="One or more model directories (or .gguf files); the first is the reference."),
    output: Path = typer.Option(..., "-o", "--output", help="Directory for bench.json and bench.png (created)."),
    batch_sizes: str = typer.Option(",".join(map(str, _D.batch_sizes)), "--batch-sizes", help="Comma-separated batch sizes."),
    seq_len: int = typer.Option(_D.seq_len, "--seq-len", help="Tokens per example (encoder length of encoder-decoders)."),
    tgt_len: int = typer.Option(None, "--tgt-len", help="Decoder tokens of encoder-decoders (default: --seq-len)."),
    warmup: int = typer.Option(_D.warmup, "--warmup", help="Untimed calls per model and batch size."),
    repeats: int = typer.Option(_D.repeats, "--repeats", help="Timed rounds per batch size (models alternate A B, B A, ...)."),
    min_repeat_s: float = typer.Option(_D.min_repeat_s, "--min-repeat-s", help="Forwards per round so a round lasts this long."),
    prune_fraction: float = typer.Option(None, "--prune-fraction",
                                         help="Also bench a copy of each model with this fraction of heads removed "
                                              "(default: none)."),
    prune_order: str = typer.Option("index", "--prune-order",
                                    help="Which heads --prune-fraction removes: 'index' (lowest indices of every "
                                         "site, even) or 'random' (seeded, global, uneven)."),
    masked: bool = typer.Option(False, "--masked", help="Also bench a copy with the same heads masked, not removed."),
    seed: int = typer.Option(_D.seed, "--seed", help="Seed of the random token ids and of --prune-order random."),
    threads: int = typer.Option(None, "--threads", help="torch threads (default: torch's own choice)."),
    no_memory: bool = typer.Option(False, "--no-memory", help="Skip the peak-memory measurement."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the check that surgery is exact for this model's "
                                   "class (refused families): check the result yourself (library: verify=False)."),
    device: str = DEVICE,
    dtype: str = typer.Option(None, "--dtype", help="The models' dtype: float32, bfloat16 or float16 (default: as saved)."),
    decode: bool = typer.Option(False, "--decode", help="Also measure decode throughput: tokens/s of greedy generate "
                                "with a cache (language models)."),
    decode_prompt: int = typer.Option(128, "--decode-prompt", help="--decode: prompt tokens."),
    decode_new: int = typer.Option(128, "--decode-new", help="--decode: new tokens generated per call."),
    decode_batch: int = typer.Option(1, "--decode-batch", help="--decode: prompts per generate call."),
    onnx: bool = typer.Option(False, "--onnx", help="Also export every model to ONNX (checked against PyTorch) and "
                              "time it with onnxruntime (the onnx extra)."),
    gqa: str = typer.Option("uniform", "--gqa", help="How --prune-fraction chooses heads under grouped-query "
                            "attention: uniform (never enlarges the KV cache), groups or free."),
    quiet: bool = QUIET,
):
    """Measure examples/s at several batch sizes; print measured and FLOP-limit speed-ups; write JSON + PNG."""
    import torch  # here, not at the top: `headprune --help` imports no torch

    from ..bench.timing import benchmark, fraction_plan
    from ..core.io import load_model
    from ..core.masks.masking import mask_from_heads, mask_heads
    from ..core.prune import prune_heads

    sizes = _batch_sizes(batch_sizes)
    settings = BenchSettings(sizes, seq_len, tgt_len, warmup, repeats, min_repeat_s, memory=not no_memory,
                             seed=seed)  # bad settings refused before loading
    if prune_fraction is not None and not 0.0 < prune_fraction <= 1.0:
        raise ConfigError(f"--prune-fraction {prune_fraction}; allowed: 0 < F <= 1")
    if prune_order not in PRUNE_ORDERS:
        raise ConfigError(f"--prune-order {prune_order!r}; allowed: {', '.join(PRUNE_ORDERS)}")
    if gqa not in ("uniform", "groups", "free"):
        raise ConfigError(f"--gqa {gqa!r}; allowed: uniform, groups, free")
    for flag, value in (("--decode-prompt", decode_prompt), ("--decode-new", decode_new),
                        ("--decode-batch", decode_batch)):
        if value < 1:
            raise ConfigError(f"{flag} {value}; allowed: an integer >= 1")
    if masked and prune_fraction is None:
        raise ConfigError("--masked needs --prune-fraction (it masks the heads the pruned copy removes)")
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads {threads}; allowed: >= 1")
        torch.set_num_threads(threads)
    place = device_dtype(device, dtype)  # refused before loading; models are pruned on the CPU, then moved
    models, refs, dropped = {}, {}, {}
    for model_dir in model_dirs:
        name = _unique(model_dir.name or str(model_dir), models)
        note(f"loading {model_dir} ...", show=not quiet)
        model = load_model(model_dir, dtype=place["dtype"])
        models[name] = model
        if prune_fraction is None:
            continue
        drop = fraction_plan(model, prune_fraction, order=prune_order, seed=seed, gqa=gqa)
        pruned = copy.deepcopy(model)
        prune_heads(pruned, drop, verify=not no_verify)
        tag = f"{prune_fraction:g}"
        models[_unique(f"{name}-pruned{tag}", models)] = pruned
        refs[list(models)[-1]] = name
        dropped[name] = drop
        if masked:
            copy_ = copy.deepcopy(model)
            mask_heads(copy_, mask_from_heads(copy_, drop))
            models[_unique(f"{name}-masked{tag}", models)] = copy_
            refs[list(models)[-1]] = name
    for each in models.values():
        each.to(place["device"])
    if onnx:
        from ..extras import require

        require("onnxruntime", "bench --onnx")  # before any timing
    if decode:
        from ..bench.decode import check_decodable

        check_decodable(models, decode_prompt, decode_new)  # before any timing
    first = next(iter(models))
    for name in models:
        if name != first and name not in refs:
            refs[name] = first
    note(f"timing {len(models)} models at batch sizes {', '.join(map(str, sizes))} ...", show=not quiet)
    result = benchmark(models, settings, reference=refs or None)
    result.extra = {"command": shlex.join(["headprune", *sys.argv[1:]]), "model_dirs": [str(d) for d in model_dirs],
                    "prune_fraction": prune_fraction, "prune_order": prune_order, "dropped": dropped, "gqa": gqa}
    if decode:
        from ..bench.decode import decode_benchmark, decode_table

        result.extra["decode"] = decode_benchmark({n: m for n, m in models.items() if "-masked" not in n},
                                                  prompt_len=decode_prompt, new_tokens=decode_new,
                                                  batch_size=decode_batch, repeats=repeats, seed=seed)
    if onnx:
        from ..export.onnx import bench_onnx

        result.extra["onnx"] = bench_onnx({n: m for n, m in models.items() if "-masked" not in n},
                                          batch_sizes=sizes, seq_len=seq_len, tgt_len=tgt_len, repeats=repeats,
                                          seed=seed, reference={k: v for k, v in refs.items() if "-masked" not in k})
    output.mkdir(parents=True, exist_ok=True)
    (output / "bench.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    result.plot(output / "bench.png")
    typer.echo(result.table())
    if any(info["kv_cache_bytes_per_token"] for info in result.models.values()):  # an encoder caches nothing
        typer.echo(_kv_lines(result))
    if decode:
        typer.echo(decode_table(result.extra["decode"]))
    if onnx:
        from ..export.onnx import onnx_table

        typer.echo(onnx_table(result.extra["onnx"]))
    typer.echo(f"{torch.get_num_threads()} torch threads.")
    for line in result.warnings():
        typer.echo(line, err=True)
    typer.echo(f"wrote {output / 'bench.json'} and {output / 'bench.png'}")


def _kv_lines(result) -> str:
    """KV cache per token and per sequence of every model (original vs pruned)."""
    w = max([22] + [len(name) for name in result.models])  # a long name keeps the columns aligned
    lines = [f"{'model':<{w}} {'KV cache B/token':>16} {'KV cache MB/sequence':>21}"]
    for name, info in result.models.items():
        lines.append(f"{name:<{w}} {info['kv_cache_bytes_per_token']:>16,} "
                     f"{info['kv_cache_bytes_per_sequence'] / 1e6:>21.3f}")
    return "\n".join(lines)


def _batch_sizes(value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in value.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(b < 1 for b in sizes):
        raise ConfigError(f"--batch-sizes {value!r}; allowed: comma-separated integers >= 1, e.g. 1,4,16,64")
    return sizes


def _unique(name: str, taken: dict) -> str:
    out, i = name, 2
    while out in taken:
        out, i = f"{name}-{i}", i + 1
    return out
