"""Why mask tuning does not help the post-LayerNorm MiniLM SST-2 classifier, and what does.

    python benchmarks/tuning_diagnosis.py [--keep 0.5,0.3]      # ~5 min on 2 shared CPU cores

Heads only (Fisher, ``keep`` share of heads), the same calibration (train rows 0..511) and
validation (train rows 512..767) as ``heads_and_neurons.py``; the test split is never read. For each
budget the mean loss on calibration and on validation of:

- ``none``: the selected heads masked, nothing compensated;
- ``tune-residual`` / ``tune-output`` / ``tune-residual-damped``: Kwon et al.'s mask tuning (one
  scale per kept head, :mod:`headprune.compression.tuning`) with each target, damping 0.01 or 1;
- ``reconstruct-residual`` / ``reconstruct-output``: the least-squares refit of every output
  projection (:mod:`headprune.compression.reconstruct`).

Writes benchmarks/results/tuning_diagnosis.json (losses, per-site reconstruction errors, seconds).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

import headprune as hp
from headprune.compression.reconstruct import reconstruct
from headprune.compression.tuning import scale_mask, tune_scales
from headprune.core.io import load_model, load_tokenizer
from headprune.evaluation import Classification
from headprune.evaluation.data import load_classification
from headprune.provenance import versions
from headprune.scoring.gradients import mean_loss
from headprune.selection.budget import budget_heads
from headprune.selection.budgets import Budget

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_tables import markdown_table  # noqa: E402
from recorded import repo_path  # noqa: E402

ROOT = Path(__file__).resolve().parent
MODEL = Path("/work/main/runs/sst2-minilm/final")


START, END = "<!-- tuning-diagnosis:start -->", "<!-- tuning-diagnosis:end -->"
VARIANTS = ("none", "tune-residual", "tune-output", "tune-residual-damped", "reconstruct-residual",
            "reconstruct-output")


def reduction(fit: list[dict]) -> float:
    """Median over layers of the share of the reconstruction error the fit removed."""
    shares = sorted(1 - (r.get("error_tuned", r.get("error_after")) / max(r.get("error_unit", r.get("error_before")),
                                                                           1e-12)) for r in fit)
    return shares[len(shares) // 2] if shares else float("nan")


def readme_section(results: dict) -> str:
    """README table from the results file (a test holds the README to it)."""
    u = results["unpruned"]
    rows = []
    for b in results["budgets"]:
        v = b["variants"]
        for split in ("calib", "val"):
            rows.append([f"{b['keep_heads']:.0%}", "calibration" if split == "calib" else "validation",
                         *(f"{v[k][split]:.4f}" for k in VARIANTS)])
        rows.append([f"{b['keep_heads']:.0%}", "median error removed per layer", "",
                     *(f"{reduction(v[k]['fit']):.1%}" for k in VARIANTS[1:])])
    lines = [START, *markdown_table(["heads kept", "loss on", *VARIANTS], rows)]
    lines.append("")
    lines.append(f"Unpruned: calibration {u['calib']:.4f}, validation {u['val']:.4f} (mean cross-entropy).")
    lines.append(END)
    return "\n".join(lines)


def readme_block(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text[text.index(START): text.index(END) + len(END)] if START in text else ""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    p.add_argument("--keep", default="0.5,0.3")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "tuning_diagnosis.json")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model, tok = load_model(args.model), load_tokenizer(args.model)
    train = load_classification(str(args.data / "sst2" / "train.tsv"), limit=768)
    calib = list(Classification(tok, (train.texts[:512], train.labels[:512]), config=model.config,
                                batch_size=32).batches())
    val = list(Classification(tok, (train.texts[512:], train.labels[512:]), config=model.config,
                              batch_size=32).batches())
    fisher = hp.fisher_information(model, calib)
    rows = []
    base = {"calib": mean_loss(model, calib), "val": mean_loss(model, val)}
    for keep in [float(k) for k in args.keep.split(",")]:
        drop = budget_heads(fisher.diag, Budget.of(keep=keep))
        variants = {}

        def masked_losses(mask):
            return {"calib": mean_loss(model, calib, mask=mask), "val": mean_loss(model, val, mask=mask)}

        t = time.perf_counter()
        variants["none"] = {**masked_losses(scale_mask(model, drop)), "seconds": time.perf_counter() - t}
        for name, target, damping in (("tune-residual", "residual", 1e-2), ("tune-output", "output", 1e-2),
                                      ("tune-residual-damped", "residual", 1.0)):
            t = time.perf_counter()
            tuned = tune_scales(model, calib, drop, damping=damping, target=target)
            variants[name] = {**masked_losses(scale_mask(model, drop, tuned.scales)),
                              "seconds": time.perf_counter() - t,
                              "fit": [{k: r[k] for k in ("site", "error_unit", "error_tuned", "fallback",
                                                         "min_scale", "max_scale")} for r in tuned.sites]}
        for name, target in (("reconstruct-residual", "residual"), ("reconstruct-output", "output")):
            t = time.perf_counter()
            pruned = copy.deepcopy(model)
            hp.prune_heads(pruned, drop, verify=False)
            fit = reconstruct(pruned, model, calib, target=target)
            variants[name] = {"calib": mean_loss(pruned, calib), "val": mean_loss(pruned, val),
                              "seconds": time.perf_counter() - t,
                              "fit": [{k: r[k] for k in ("layer", "error_before", "error_after")} for r in fit]}
        rows.append({"keep_heads": keep, "dropped": sum(len(v) for v in drop.values()), "variants": variants})
        print(keep, {k: (round(v["calib"], 4), round(v["val"], 4)) for k, v in variants.items()}, flush=True)
    out = {"signature": {"model": repo_path(args.model), "data": {"calibration": "sst2/train.tsv rows 0..511",
                                                            "validation": "sst2/train.tsv rows 512..767"},
                         "scores": "diagonal Fisher of the head mask on the calibration rows", "seed": 0,
                         "versions": versions()},
           "unpruned": base, "budgets": rows}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
