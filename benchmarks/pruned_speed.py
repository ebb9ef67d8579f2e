"""Speed of a BERT-base shape with 50% of its heads removed vs the original, against the FLOP limit.

    python benchmarks/pruned_speed.py            # BERT-base shape, seq 128, batch 1/4/16/64: ~5-6 min on 2 quiet cores
    python benchmarks/pruned_speed.py --quick --output /tmp/pruned_speed.json   # tiny shapes, seconds

Random weights (speed does not depend on them). Two plans remove 72 of 144 heads: ``even`` (heads
0-5 of every layer) and ``uneven`` (a fixed random score per head, times a random scale per
layer, lowest 72 globally: layers keep 0 to 12 heads). All three models run in alternated rounds
(A B C, C B A, ...); per batch size the JSON has examples/s, the measured speed-up (median of
paired ratios), the FLOP limit and the efficiency (measured - 1) / (limit - 1); goal >= 0.9 at
batch 4, 16 and 64. Writes benchmarks/results/pruned_speed.json (+ .png); quiet machines only.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import torch
import transformers as T

import headprune as hp
from headprune.bench import BenchSettings, benchmark, fraction_plan
from headprune.selection import lowest_heads

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import command  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOAL, GOAL_BATCHES = 0.9, (4, 16, 64)
FULL = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
QUICK = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)


def build(shape: dict, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = T.BertConfig(**shape, num_labels=3, max_position_embeddings=512)
    return T.BertForSequenceClassification(config).eval()


def uneven_plan(model, fraction: float, seed: int = 0) -> dict[str, list[int]]:
    """Random scores with a random scale per layer: the lowest ``fraction`` globally (some layers emptied)."""
    g = torch.Generator().manual_seed(seed)
    scores = {s.name: torch.rand(s.num_heads, generator=g) * torch.exp(2.0 * torch.randn(1, generator=g))
              for s in hp.find_sites(model)}
    return lowest_heads(scores, fraction=fraction)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes and few repeats (a test that it runs)")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "pruned_speed.json")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all CPUs)")
    ap.add_argument("--fraction", type=float, default=0.5, help="fraction of heads removed")
    ap.add_argument("--seq-len", type=int, default=None, help="default 128 (16 with --quick)")
    ap.add_argument("--batch-sizes", default=None, help="comma-separated (default 1,4,16,64; 1,4 with --quick)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed rounds at every batch size (default 15/11/7/5 at batch 1/4/16/64; 2 with --quick)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    quick = args.quick
    seq_len = args.seq_len or (16 if quick else 128)
    batch_sizes = tuple(int(b) for b in args.batch_sizes.split(",")) if args.batch_sizes else \
        (1, 4) if quick else (1, 4, 16, 64)
    # Fewer rounds where one forward is long: BERT-base at 64 x 128 takes ~12 s on 2 cores.
    default = {1: 2, 4: 2} if quick else {1: 15, 4: 11, 16: 7, 64: 5}
    repeats = {b: args.repeats or default.get(b, 5) for b in batch_sizes}
    original = build(QUICK if quick else FULL)
    plans = {"even": fraction_plan(original, args.fraction, order="index"),
             "uneven": uneven_plan(original, args.fraction)}
    models = {"original": original}
    for name, plan in plans.items():
        models[name] = copy.deepcopy(original)
        hp.prune_heads(models[name], plan)
    settings = BenchSettings(batch_sizes=batch_sizes, seq_len=seq_len, warmup=1, repeats=repeats,
                             min_repeat_s=0.0 if quick else 0.3)
    result = benchmark(models, settings, progress=not quick)
    per_batch = []
    for b in batch_sizes:
        row = {"batch": b, "examples_per_s": {r["model"]: r["examples_per_s"] for r in result.runs if r["batch"] == b}}
        for name in plans:
            s = result.speedup(name, b)
            row[name] = {k: s[k] for k in ("measured", "measured_q25", "measured_q75", "ratio_of_medians",
                                           "flop_limit", "efficiency")}
        per_batch.append(row)
    goal_met = {name: all((row[name]["efficiency"] or 0) >= GOAL for row in per_batch if row["batch"] in GOAL_BATCHES)
                for name in plans}
    out = {
        "name": "pruned_speed",
        "command": command(__file__),
        "machine": result.machine,
        "versions": result.versions,
        "settings": {**result.settings, "quick": quick, "threads": args.threads, "fraction": args.fraction,
                     "shape": QUICK if quick else FULL, "model": "BertForSequenceClassification, random weights"},
        "plans": {name: {"removed": plan, "kept_per_layer": [len(k) for k in hp.kept_heads(models[name]).values()],
                         "sites_left": len(hp.find_sites(models[name]))} for name, plan in plans.items()},
        "models": result.models,
        "per_batch": per_batch,
        "goal": f"efficiency = (measured - 1) / (FLOP limit - 1) >= {GOAL} at batch {', '.join(map(str, GOAL_BATCHES))}",
        "goal_met": goal_met,
        "runs": result.runs,
        "seconds": result.seconds,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2) + "\n")
    result.plot(args.output.with_suffix(".png"))
    print(result.table())
    print(f"goal met: {goal_met}; wrote {args.output}")


if __name__ == "__main__":
    main()
