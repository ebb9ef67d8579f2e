"""A compression run as a directory: the pruned model itself, ``compress.json`` and ``report.html``.

:func:`run_compress` calls :func:`headprune.compression.compress` (the one entry point) and writes the
output directory: a loadable model (``headprune.load_pruned`` / ``headprune evaluate``) with its tokenizer,
beside ``compress.json`` (settings, what was removed, sizes, scores before and after, speed),
``results.json`` + ``report.html`` (the human summary) and per-site tables: for heads alone ``heads.csv`` and
``kept_heads.png`` (with tuned scales), for neurons or both ``units.csv`` and ``kept_units.png``; the stage log
with the guard's losses in both.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..bench.figures import speed_text
from ..bench.settings import BenchSettings
from ..bench.timing import benchmark
from ..compression.entry import check_model, compress
from ..compression.settings import PruneSettings
from ..core.io import save_pruned
from ..core.model.cost import flops_per_example
from ..core.model.sites import find_sites
from ..distributed import is_main
from ..errors import ConfigError
from ..evaluation.metrics import format_score
from ..provenance import code_identity, versions
from ..report import build_report
from ..report.figures import kept_heads_grid, kept_units_per_layer
from .rundir import RunDir


@dataclass
class RunInputs:
    """What a compression run reads besides the model and its calibration batches: the budget over heads and
    neurons' held-out ``val_batches`` and ``fit_batches``, per-unit ``prices`` (with the ``latency_table`` they
    came from), the ``signature`` of the data, and the speed measurement (``bench_batch`` None: none)."""

    val_batches: list | None = None
    fit_batches: list | None = None
    prices: object = None
    latency_table: dict | None = None
    signature: dict | None = None
    bench_batch: int | None = 16
    bench_repeats: int = 5
    verify: bool = True  # False: skip the check that surgery is exact for the model's class
    progress: bool = False


@dataclass
class _Done:
    """A finished compression, as the record writers read it."""

    run: RunDir
    out: Path
    settings: PruneSettings
    sites: dict
    result: object  # CompressResult
    before: object  # the evaluations before and after
    after: object
    speed: object
    bench_batch: int | None
    model: nn.Module


def run_compress(model: nn.Module, tokenizer, evaluator, calib_batches: Iterable[Mapping[str, torch.Tensor]],
                 out: str | Path, settings: PruneSettings, inputs: RunInputs | None = None) -> tuple[Path, str]:
    """Score ``model`` on ``evaluator``, compress it on ``calib_batches`` (:func:`headprune.compression.compress`),
    score it again, time both, and write the directory ``out`` (which must not exist).
    Returns (the report's path, a one-line summary of what was kept)."""
    inputs = inputs or RunInputs()
    out = output_dir(out)
    bench_batch = inputs.bench_batch
    if bench_batch is not None and (isinstance(bench_batch, bool) or not isinstance(bench_batch, int) or bench_batch < 1):
        raise ConfigError(f"bench_batch={bench_batch!r}; allowed: an integer >= 1, or None for no timing")
    if settings.low_memory and bench_batch is not None:
        raise ConfigError(f"bench_batch={bench_batch} with low_memory=True: the model is pruned in place, so no unpruned "
                          "model is left to time against; allowed: bench_batch=None (no timing)")
    check_model(model, settings)  # a count above the model's heads: refused before any work
    flops_per_example(model, settings.seq_len, tgt_len=settings.tgt_len)  # refuse a length the model cannot run, now
    sites = {s.name: s for s in find_sites(model)}
    verify, progress = inputs.verify, inputs.progress
    before = evaluator.evaluate(model, progress=progress)
    result = compress(model, calib_batches, settings, val_batches=inputs.val_batches, fit_batches=inputs.fit_batches,
                      prices=inputs.prices, verify=verify, progress=progress)
    after = evaluator.evaluate(result.model, progress=progress)
    speed = bench_and_save(model, result.model, out, tokenizer, settings, bench_batch, inputs.bench_repeats)
    sig = {"model": None, "data": None, "split": None, "n": before.n, **(inputs.signature or {}),
           "method": f"{settings.scorer.name} {settings.units} ({settings.price}) + "
                     f"{'+'.join(settings.compensation_names) or 'none'}",
           "settings": settings.to_dict(), "seed": settings.seed, "code": code_identity(), "versions": versions()}
    run = RunDir(out, sig, made_here=True)  # save_pruned has just created ``out``: its files are this run's
    record = {"signature": run.signature, **result.to_dict(), "evaluation": {"before": eval_record(before),
                                                                   "after": eval_record(after)},
              "speed": speed_record(speed)}
    if inputs.latency_table is not None:
        record["latency_table"] = inputs.latency_table
    run.write_json("compress.json", record)
    result.plan.save(out / "plan.json")  # + plan.safetensors: headprune apply MODEL plan.json replays it
    run.write_text("compress.toml", settings.to_toml())  # headprune compress ... --config compress.toml repeats it
    write = _heads_results if settings.units == "heads" else _units_results  # per site, with the tuned scales
    write(_Done(run, out, settings, sites, result, before, after, speed, bench_batch, model))
    report = build_report(out)
    run.close()
    return report, result.summary()


def _heads_results(done: _Done) -> None:
    """``heads.csv``, ``kept_heads.png`` and ``results.json`` of the head plan."""
    run, out, settings, sites, result = done.run, done.out, done.settings, done.sites, done.result
    before, after, speed, bench_batch, model = done.before, done.after, done.speed, done.bench_batch, done.model
    rows = _site_rows(sites, result)
    run.write_csv("heads.csv", rows)
    kept_heads_grid(sites, result.dropped_heads, result.scales, out / "kept_heads.png")
    metric = before.metric
    size = result.sizes
    headline = [
        *kept_rows(metric, before.score, after.score, size, counts=("heads",),
                   shares=(("model FLOPs", "flops"), ("attention FLOPs", "attention_flops"), ("parameters", "params"))),
        *([["KV cache per token", f"{size['before']['kv_cache_bytes_per_token']:,} -> "
                                  f"{size['after']['kv_cache_bytes_per_token']:,} bytes"]]
          if size["before"]["kv_cache_bytes_per_token"] else []),  # an encoder caches nothing: no "0 -> 0"
        ["compression time", f"{result.seconds['total']:.1f} s"]]
    if result.losses:  # which stages the guard kept: a rejected stage leaves the model as the one before
        headline.append(["stages", ", ".join(f"{k} {v}" for k, v in result.stages.items())])
    if speed is not None:
        up = speed.speedups[0]
        headline.append([f"speed-up at batch {bench_batch} (FLOP limit {up['flop_limit']:.2f}x)",
                         speed_text(up)])
    sig = run.signature
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


def _units_results(done: _Done) -> None:
    """``units.csv``, ``kept_units.png`` and ``results.json`` of the budget over heads and neurons."""
    run, out, settings, result = done.run, done.out, done.settings, done.result
    before, after, speed, bench_batch = done.before, done.after, done.speed, done.bench_batch
    rows = _unit_rows(result)
    run.write_csv("units.csv", rows)
    kept_units_per_layer(rows, out / "kept_units.png")
    size = result.sizes
    metric = before.metric
    headline = [
        *kept_rows(metric, before.score, after.score, size, counts=("heads", "neurons"),
                   shares=(("model FLOPs", "flops"), ("parameters", "params"))),
        ["stages", ", ".join(f"{k} {v}" for k, v in result.stages.items())],
        ["compression time", f"{result.seconds['total']:.1f} s"]]
    if speed is not None:
        up = speed.speedups[0]
        headline.append([f"speed-up at batch {bench_batch} (FLOP limit {up['flop_limit']:.2f}x)", speed_text(up)])
    notes = [f"Calibration / validation: {result.split}; the validation batches were used only to accept or "
             "turn down the reconstruction.", f"Validation losses: {result.losses or 'not measured'}."]
    run.write_json("results.json", {
        "title": f"Compressed {settings.units} to {settings.share:.0%} of their {settings.price}",
        "experiment": "compress", "metric": metric, "headline": headline, "signature": run.signature, "notes": notes,
        "figures": [{"file": "kept_units.png", "caption": "Heads and FFN neurons kept (colour) and removed (grey) "
                                                          "per layer."}],
        "tables": [{"title": "Per layer", "file": "units.csv", "max_rows": 120}]})


def _unit_rows(result) -> list[dict]:
    fits = {r["layer"]: r for r in result.reconstruction}
    rows = []
    for name, kept in {**result.kept_heads, **result.kept_neurons}.items():
        fit = fits.get(name, {})
        dropped = result.dropped_heads.get(name, result.dropped_neurons.get(name, []))
        rows.append({"unit": name, "kind": "neurons" if name.endswith(".ffn") else "heads", "kept": len(kept),
                     "dropped": len(dropped), "refit_error_before": fit.get("error_before", ""),
                     "refit_error_after": fit.get("error_after", "")})
    return rows


def _guard_notes(result) -> list[str]:
    if not result.losses:
        return []
    losses = ", ".join(f"{stage} {loss:.4f}" for stage, loss in result.losses.items())
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


def _budget(s: PruneSettings) -> str:
    if s.n_keep is not None:
        return f"keep {s.n_keep} heads"
    return f"keep {s.share:.0%} of " + {"count": "heads", "kv": "the KV cache", "flops": "head FLOPs"}.get(
        s.price, f"the heads' {s.price}")


def _site_rows(sites: dict, result) -> list[dict]:
    tuning = {t["site"]: t for t in result.tuning}
    rows = []
    for name, site in sites.items():
        dropped = result.dropped_heads.get(name, [])
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
        timing = BenchSettings(batch_sizes=(bench_batch,), seq_len=settings.seq_len, tgt_len=settings.tgt_len,
                               repeats=bench_repeats, memory=False)
        speed = benchmark({"original": model, "compressed": compressed}, timing)
    save_pruned(compressed, out, tokenizer=tokenizer)
    return speed


def speed_record(speed) -> dict | None:
    """The JSON-ready part of a :func:`bench_and_save` timing."""
    return None if speed is None else {"runs": speed.runs, "speedups": speed.speedups, "machine": speed.machine,
                                       "settings": speed.settings}
