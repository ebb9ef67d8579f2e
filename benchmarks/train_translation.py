"""Train the default small translation model on Multi30k en->fr for a time budget; BLEU per epoch.

    nice -n 10 python benchmarks/train_translation.py --budget-min 12

Writes benchmarks/results/train_translation.json. Epochs are run one call at a time (each call
resumes the previous checkpoint), and another epoch is started only if it should end within the
budget, judged by the mean duration of the epochs so far.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from headprune.train import TranslationTrainSettings, train_translation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import command, repo_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def read(path: Path, n: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:n] if n is not None else lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data/multi30k"))
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="fr")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "multi30k-en-fr-small")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "train_translation.json")
    ap.add_argument("--budget-min", type=float, default=12.0)
    ap.add_argument("--max-epochs", type=int, default=50)
    ap.add_argument("--eval-n", type=int, default=500, help="first N lines of test_2016_flickr")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (2 cores shared by other jobs here)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    src, tgt = read(args.data / f"train.{args.src}.gz"), read(args.data / f"train.{args.tgt}.gz")
    ev_src = read(args.data / f"test_2016_flickr.{args.src}.gz", args.eval_n)
    ev_tgt = read(args.data / f"test_2016_flickr.{args.tgt}.gz", args.eval_n)
    shutil.rmtree(args.out, ignore_errors=True)  # measure from scratch

    budget = args.budget_min * 60
    results: dict = {}
    load = {"start": os.getloadavg()[0]}  # 1-minute load average: other jobs share these 2 cores
    for epochs in range(1, args.max_epochs + 1):
        elapsed = time.perf_counter() - t_start
        if epochs > 1:
            per_epoch = elapsed / (epochs - 1)
            if elapsed + per_epoch > budget:
                break
        settings = TranslationTrainSettings(epochs=epochs, lr=args.lr, warmup_steps=args.warmup_steps,
                                            batch_size=args.batch_size, seed=args.seed)
        res = train_translation(src, tgt, settings=settings, output_dir=args.out,
                                eval_sources=ev_src, eval_targets=ev_tgt)
        rec = res.log[-1]
        load[f"after_epoch_{rec['epoch']}"] = os.getloadavg()[0]
        print(f"epoch {rec['epoch']}: loss {rec['loss']:.3f}  BLEU {rec['eval_bleu']:.2f}  "
              f"train {rec['seconds']:.0f}s  eval {rec['eval_seconds']:.0f}s  "
              f"total {time.perf_counter() - t_start:.0f}s", file=sys.stderr, flush=True)
        results = {
            "benchmark": "train_translation",
            "command": command(__file__),
            "machine": f"2 CPU cores shared with other jobs ({platform.processor() or platform.machine()}), "
                       f"torch threads={args.threads}, os.cpu_count={os.cpu_count()}",
            "versions": res.info["versions"] | {"python": platform.python_version()},
            "data": {"train": f"{repo_path(args.data)}/train.{{{args.src},{args.tgt}}}.gz",
                     "eval": f"{repo_path(args.data)}/test_2016_flickr.{{{args.src},{args.tgt}}}.gz, first {len(ev_src)} lines",
                     "n_train_pairs": res.info["n_train"], "n_skipped_too_long": res.info["n_skipped_too_long"]},
            "model": {"architecture": res.info["architecture"], "n_parameters": res.info["n_parameters"],
                      "vocab_size": res.info["vocab_size"]},
            "settings": {k: v for k, v in res.info["settings"].items() if k != "epochs"},
            "load_average_1min": load,
            "budget_s": budget,
            "total_seconds": round(time.perf_counter() - t_start, 1),
            "output_dir": repo_path(args.out),
            "epochs": [{k: r[k] for k in ("epoch", "global_step", "loss", "seconds", "tokens_per_s", "eval_nll",
                                          "eval_bleu", "eval_seconds")} for r in res.log],
            "bleu_signature": rec["bleu_signature"],
            "decoding": rec.get("generation", "greedy, max_new_tokens = max_length (before the shared protocol)"),
        }
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["epochs"], indent=1))


if __name__ == "__main__":
    main()
