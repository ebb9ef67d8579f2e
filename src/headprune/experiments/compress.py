"""A compression run as a directory: the pruned model itself, ``compress.json`` and ``report.html``.

The output directory is a loadable model (``headprune.load_pruned`` / ``headprune evaluate``) with
its tokenizer, beside ``compress.json`` (settings, chosen heads, scales, sizes, scores before and
after, speed), ``results.json`` + ``report.html`` (the human summary), ``heads.csv`` and
``kept_heads.png``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from ..bench.timing import benchmark
from ..compression.compress import check_head_count, compress_heads
from ..compression.plan import CompressSettings
from ..core.cost import flops_per_example
from ..core.io import save_pruned
from ..core.sites import find_sites
from ..distributed import is_main
from ..errors import ConfigError
from ..evaluation.metrics import format_score
from ..provenance import code_identity, versions
from ..report import build_report
from ..report.figures import kept_heads_grid
from .rundir import RunDir


def run_compress(model: nn.Module, tokenizer, evaluator, calib_batches: Iterable[Mapping[str, torch.Tensor]],
                 out: str | Path, *, settings: CompressSettings, signature: dict | None = None,
                 bench_batch: int | None = 16, bench_repeats: int = 5, verify: bool = True,
                 progress: bool = False) -> Path:
    """Score ``model`` on ``evaluator``, compress it on ``calib_batches``, score it again, time both,
    and write the directory ``out`` (which must not exist). Returns the report's path."""
    out = output_dir(out)
    if bench_batch is not None and (isinstance(bench_batch, bool) or not isinstance(bench_batch, int) or bench_batch < 1):
        raise ConfigError(f"bench_batch={bench_batch!r}; allowed: an integer >= 1, or None for no timing")
    sites = {s.name: s for s in find_sites(model)}
    check_head_count(model, settings.n_keep, None)  # a count above the model's heads: refused before any work
    flops_per_example(model, settings.seq_len, tgt_len=settings.tgt_len)  # refuse a length the model cannot run, now
    before = evaluator.evaluate(model, progress=progress)
    result = compress_heads(model, calib_batches, settings, verify=verify, progress=progress)
    after = evaluator.evaluate(result.model, progress=progress)
    speed = bench_and_save(model, result.model, out, tokenizer, settings, bench_batch, bench_repeats)
    sig = {"model": None, "data": None, "split": None, "n": before.n, **(signature or {}),
           "method": settings.method, "settings": asdict(settings), "seed": settings.seed, "code": code_identity(), "versions": versions()}
    run = RunDir(out, sig, made_here=True)
    evaluation = {"before": eval_record(before), "after": eval_record(after)}
    record = {"signature": sig, **result.to_dict(), "evaluation": evaluation, "speed": speed_record(speed)}
    run.write_json("compress.json", record)
    rows = _site_rows(sites, result)
    run.write_csv("heads.csv", rows)
    kept_heads_grid(sites, result.dropped, result.scales, out / "kept_heads.png")
    metric = before.metric
    size = result.sizes
    headline = [
        *kept_rows(metric, before.score, after.score, size, counts=("heads",),
                   shares=(("model FLOPs", "flops"), ("attention FLOPs", "attention_flops"), ("parameters", "params"))),
        *([["KV cache per token", f"{size['before']['kv_cache_bytes_per_token']:,} -> "
                                  f"{size['after']['kv_cache_bytes_per_token']:,} bytes"]]
          if size["before"]["kv_cache_bytes_per_token"] else []),  # an encoder caches nothing: no "0 -> 0"
        ["compression time", f"{result.seconds['total']:.1f} s"]]
    if result.calib_loss:  # which stages the guard kept: a rejected stage leaves the model as the one before
        headline.append(["stages", ", ".join(f"{k} {'rejected' if k in result.rejected else 'kept'}"
                                             for k in result.calib_loss)])
    if speed is not None:
        up = speed.speedups[0]
        headline.append([f"speed-up at batch {bench_batch} (FLOP limit {up['flop_limit']:.2f}x)",
                         "noisy: not readable (compress.json keeps it)" if up.get("noisy") else f"{up['measured']:.2f}x"])
    run.write_json("results.json", {
        "title": f"Compressed with {settings.method} ({_budget(settings)})", "experiment": "compress",
        "metric": metric, "headline": headline, "signature": sig,
        "notes": [f"Calibration and evaluation data: {sig.get('calib_data')} / {sig.get('data')}.",
                  *_guard_notes(result),
                  f"FLOPs per example at {settings.seq_len} tokens"
                  + (f" ({settings.tgt_len or settings.seq_len} decoder tokens)." if _enc_dec(model) else ".")],
        "figures": [{"file": "kept_heads.png", "caption": "Kept heads per site (colour: tuned scale folded into "
                     "the output projection; blank: removed)."}],
        "tables": [{"title": "Per site", "file": "heads.csv", "max_rows": 80}],
    })
    report = build_report(out)
    run.close()
    return report


def _guard_notes(result) -> list[str]:
    if not result.calib_loss:
        return []
    losses = ", ".join(f"{stage} {loss:.4f}" for stage, loss in result.calib_loss.items())
    turned = (f" Turned down (they raised it): {', '.join(result.rejected)}." if result.rejected else
              " Every stage lowered it or kept it equal.")
    return [f"Mean calibration loss after each stage: {losses}.{turned}"]


def eval_record(result) -> dict:
    """An evaluation as compress.json holds it (without the hypotheses of a translation)."""
    d = result.to_dict()
    d["extra"] = {k: v for k, v in d.get("extra", {}).items() if k != "hypotheses"}
    return d


def _enc_dec(model: nn.Module) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def _budget(s: CompressSettings) -> str:
    if s.keep is not None:
        return f"keep {s.keep:.0%} of heads"
    if s.n_keep is not None:
        return f"keep {s.n_keep} heads"
    if s.kv is not None:
        return f"keep {s.kv:.0%} of the KV cache"
    return f"keep {s.flops:.0%} of head FLOPs"


def _site_rows(sites: dict, result) -> list[dict]:
    tuning = {t["site"]: t for t in result.tuning}
    rows = []
    for name, site in sites.items():
        dropped = result.dropped.get(name, [])
        kept = [h for h in range(site.num_heads) if h not in dropped]
        scales = (result.scales or {}).get(name)
        t = tuning.get(name, {})
        rows.append({"site": name, "kind": site.kind, "heads": site.num_heads, "kept": len(kept),
                     "kept_heads": " ".join(map(str, kept)),
                     "scales": " ".join(f"{x:.3f}" for x in scales) if scales else "",
                     "error_unit": t.get("error_unit", ""), "error_tuned": t.get("error_tuned", ""),
                     "fallback": t.get("fallback", "")})
    return rows


def kept_rows(metric: str, before: float, after: float, size: dict, *, counts: tuple, shares: tuple) -> list[list[str]]:
    """Headline rows of a compression: the score before and after, then ``N kept`` (counts of ``size``'s
    before/after) and ``X kept`` (shares) rows."""
    b, a = size["before"], size["after"]
    return [[f"{metric} before", format_score(metric, before)], [f"{metric} after", format_score(metric, after)],
            *[[f"{k} kept", f"{a[k]} / {b[k]}"] for k in counts],
            *[[f"{label} kept", f"{a[k] / max(b[k], 1):.1%}"] for label, k in shares]]


def output_dir(out: str | Path) -> Path:
    """``out``, refused if it exists; under torchrun every rank but 0 writes to a scratch copy instead
    (the ranks share the scoring, rank 0 alone writes ``out``)."""
    out = Path(out)
    if out.exists():
        raise ConfigError(f"output {str(out)!r} already exists; choose a new directory")
    return out if is_main() else Path(tempfile.mkdtemp(prefix="headprune-rank-")) / out.name


def bench_and_save(model: nn.Module, compressed: nn.Module, out: Path, tokenizer, settings, bench_batch: int | None,
                   bench_repeats: int):
    """Time ``model`` vs ``compressed`` at ``bench_batch`` (None: no timing), then save ``compressed`` to ``out``."""
    speed = None
    if bench_batch is not None:
        speed = benchmark({"original": model, "compressed": compressed}, batch_sizes=(bench_batch,),
                          seq_len=settings.seq_len, tgt_len=settings.tgt_len, repeats=bench_repeats, memory=False)
    save_pruned(compressed, out, tokenizer=tokenizer)
    return speed


def speed_record(speed) -> dict | None:
    """The JSON-ready part of a :func:`bench_and_save` timing."""
    return None if speed is None else {"runs": speed.runs, "speedups": speed.speedups, "machine": speed.machine,
                                       "settings": speed.settings}
