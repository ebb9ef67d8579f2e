"""A heads-and-neurons compression run as a directory: the pruned model, ``compress.json``, ``report.html``.

Like :mod:`.compress` (heads only), for :func:`headprune.compression.units.compress_pool`: the
output directory is a loadable model (``headprune.load_pruned``) with its tokenizer, beside
``compress.json`` (settings, dropped heads and neurons, sizes, the stages kept, validation losses,
scores before and after, speed), ``results.json`` + ``report.html`` and ``units.csv`` (per layer).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from ..compression.units import UnitSettings, compress_pool
from ..core.cost import flops_per_example
from ..provenance import code_identity, versions
from ..report import build_report
from ..report.figures import kept_units_per_layer
from .compress import bench_and_save, eval_record, kept_rows, output_dir, speed_record
from .rundir import RunDir


def run_compress_units(model: nn.Module, tokenizer, evaluator, calib_batches: Iterable[Mapping[str, torch.Tensor]],
                       out: str | Path, *, settings: UnitSettings, val_batches=None, fit_batches=None, signature: dict | None = None,
                       prices=None, latency_table: dict | None = None,
                       bench_batch: int | None = 16, bench_repeats: int = 5, verify: bool = True,
                       progress: bool = False) -> tuple[Path, str]:
    """Score ``model`` on ``evaluator``, compress it, score it again, time both, write ``out`` (new).
    Returns (the report's path, the one-line summary of what was kept)."""
    out = output_dir(out)
    flops_per_example(model, settings.seq_len, tgt_len=settings.tgt_len)  # refuse a length the model cannot run, now
    before = evaluator.evaluate(model, progress=progress)
    result = compress_pool(model, calib_batches, settings, val_batches=val_batches, fit_batches=fit_batches,
                            prices=prices, verify=verify,
                            progress=progress)
    after = evaluator.evaluate(result.model, progress=progress)
    speed = bench_and_save(model, result.model, out, tokenizer, settings, bench_batch, bench_repeats)
    sig = {"model": None, "data": None, "split": None, "n": before.n, **(signature or {}),
           "method": f"{settings.scores} {settings.units} ({settings.price}) + {settings.compensate}",
           "settings": asdict(settings), "code": code_identity(), "versions": versions()}
    run = RunDir(out, sig, made_here=True)  # save_pruned has just created ``out``: its files are this run's
    record = {"signature": sig, **result.to_dict(), "evaluation": {"before": eval_record(before), "after": eval_record(after)},
              "speed": speed_record(speed)}
    if latency_table is not None:
        record["latency_table"] = latency_table
    run.write_json("compress.json", record)
    rows = _rows(result)
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
        headline.append([f"speed-up at batch {bench_batch}", f"{up['measured']:.2f}x" + (" (noisy)" if up.get("noisy") else "")])
    notes = [f"Calibration / validation: {result.split}; the validation batches were used only to accept or "
             "turn down the reconstruction.", f"Validation losses: {result.val_loss or 'not measured'}."]
    run.write_json("results.json", {
        "title": f"Compressed {settings.units} to {settings.share:.0%} of their {settings.price}",
        "experiment": "compress", "metric": metric, "headline": headline, "signature": sig, "notes": notes,
        "figures": [{"file": "kept_units.png", "caption": "Heads and FFN neurons kept (colour) and removed (grey) "
                                                          "per layer."}],
        "tables": [{"title": "Per layer", "file": "units.csv", "max_rows": 120}]})
    return build_report(out), result.summary()


def _rows(result) -> list[dict]:
    fits = {r["layer"]: r for r in result.reconstruction}
    rows = []
    for name, kept in {**result.kept_heads, **result.kept_neurons}.items():
        fit = fits.get(name, {})
        dropped = result.dropped_heads.get(name, result.dropped_neurons.get(name, []))
        rows.append({"unit": name, "kind": "neurons" if name.endswith(".ffn") else "heads", "kept": len(kept),
                     "dropped": len(dropped), "refit_error_before": fit.get("error_before", ""),
                     "refit_error_after": fit.get("error_after", "")})
    return rows
