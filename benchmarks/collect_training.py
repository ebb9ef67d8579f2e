"""Collect what the study models' training runs logged (studies/train_models.sh) into one JSON.

    python benchmarks/collect_training.py [--runs runs] [--output benchmarks/results/train_models.json]

Reads each run directory's ``run.json`` (task, sizes, settings, versions) and ``train_log.jsonl``
(per epoch: seconds, loss, eval accuracy or BLEU) as the training wrote them; nothing is re-measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEEP = ("epoch", "seconds", "loss", "examples_per_s", "tokens_per_s", "eval_accuracy", "eval_loss", "eval_nll",
        "eval_bleu", "bleu_signature", "eval_n", "eval_seconds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "runs")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "train_models.json")
    args = ap.parse_args()
    models = {}
    for run in sorted(p.parent for p in args.runs.glob("*/train_log.jsonl")):
        meta = json.loads((run / "run.json").read_text())
        log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines() if line.strip()]
        models[run.name] = {
            "task": meta.get("task"), "n_train": meta.get("n_train"), "n_eval": meta.get("n_eval"),
            "n_parameters": meta.get("n_parameters"), "label_names": meta.get("label_names"),
            "settings": meta.get("settings"), "versions": meta.get("versions"),
            "epochs": [{k: e[k] for k in KEEP if k in e} for e in log],
            "train_seconds_total": round(sum(e.get("seconds", 0.0) for e in log), 1),
        }
    result = {"benchmark": "train_models", "command": "bash studies/train_models.sh (see each model's settings)",
              "machine": f"{os.cpu_count()} CPU cores ({platform.machine()}), shared with the other study jobs; "
                         "torch threads = 1 per training run", "models": models}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    for name, m in models.items():
        last = m["epochs"][-1] if m["epochs"] else {}
        score = last.get("eval_accuracy", last.get("eval_bleu"))
        print(f"{name}: {len(m['epochs'])} epoch(s), {m['train_seconds_total']} s, final eval {score}")


if __name__ == "__main__":
    main()
