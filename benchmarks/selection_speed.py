"""Selection under a FLOP budget: the heap pass vs the rescanning algorithms it replaced, in milliseconds.

    python benchmarks/selection_speed.py           # ~1 min on 2 CPU cores (the old algorithms)
    python benchmarks/selection_speed.py --quick   # the new ones only, at full size

A 5,120-head plan (80 layers x 64 heads, prices from a Llama-like layer: 8,192 wide, head size 128) with
random scores, half of the head FLOPs kept:

- ``free``: no grouped-query attention, head-by-head knapsack by score per marginal FLOP
  (:func:`headprune.selection.budget.budget_heads`, what ``gqa="free"`` runs);
- ``uniform``: 8 key/value heads per layer, the default of :func:`headprune.select_heads` (steps of one
  query head per key/value group, lowest score per FLOP saved first).

"old" runs the algorithms as first written (every remaining head or site rescanned per pick, the whole plan
re-priced per candidate), from ``tests/test_selection_linear.py``, which proves both give the same
selections on random instances. The old algorithms are quadratic or worse (the ``free`` knapsack took 484 s
at 5,120 heads on the shared 2-core machine, ``uniform`` longer), so they are timed on smaller plans (20
layers, 1,280 heads; 10 layers, 640 heads), and the new ones on those and at full size.
Writes benchmarks/results/selection_speed.json (medians of ``--repeats`` runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from headprune.core.model.cost import HeadCosts
from headprune.provenance import versions
from headprune.selection import select_heads
from headprune.selection.budget import budget_heads
from headprune.selection.budgets import Budget, HeadRule

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "selection_speed.json"
_spec = importlib.util.spec_from_file_location("selection_reference", ROOT.parent / "tests" / "test_selection_linear.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

HIDDEN, HEAD_DIM, SEQ = 8192, 128, 128


def plan(layers: int, heads: int, kv_heads: int, seed: int = 0):
    """({site: [H] scores}, HeadCosts) of a decoder of ``layers`` x ``heads`` query heads over ``kv_heads``."""
    g = torch.Generator().manual_seed(seed)
    per = heads // kv_heads
    own = 2.0 * (SEQ * HIDDEN * HEAD_DIM * 2 + 2 * HEAD_DIM * SEQ * SEQ)  # q and o rows, scores and values
    kv = 2.0 * 2 * SEQ * HIDDEN * HEAD_DIM if kv_heads < heads else 0.0
    if kv_heads == heads:
        own += 2.0 * 2 * SEQ * HIDDEN * HEAD_DIM  # each head its own key and value
    scores, head, kvd, group = {}, {}, {}, {}
    for layer in range(layers):
        name = f"decoder.{layer}.self"
        scores[name] = torch.rand(heads, generator=g, dtype=torch.float64)
        head[name] = torch.full((heads,), own, dtype=torch.float64)
        kvd[name], group[name] = kv, [h // per for h in range(heads)]
    return scores, HeadCosts(head, kvd, group)


def select(case: str, scores, costs: HeadCosts, share: float):
    if case == "free":
        return budget_heads(scores, Budget.of(flops=share), costs)
    return select_heads(scores, costs.group, Budget.of(flops=share), HeadRule(), costs)


def select_old(case: str, scores, costs: HeadCosts, share: float):
    if case == "free":
        return reference.reference_knapsack(scores, costs, share, 0)
    return reference.reference_by_flops(scores, costs.group, "uniform", share, costs, 0)


def timed(fn, repeats: int) -> tuple[float, float, object]:
    """(median wall ms, median CPU ms of this process, the last result). On a machine shared with other jobs
    the wall time includes waiting for a core; the CPU time is what the selection itself costs."""
    times, cpu, out = [], [], None
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return statistics.median(times), statistics.median(cpu), out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="new algorithms only")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows = []
    for case, layers, heads, kv_heads in (("free", 80, 64, 64), ("free", 20, 64, 64), ("uniform", 80, 64, 8),
                                          ("uniform", 10, 64, 8)):
        scores, costs = plan(layers, heads, kv_heads)
        new_ms, new_cpu_ms, new = timed(lambda s=scores, c=costs, case=case: select(case, s, c, args.share),
                                        args.repeats)
        row = {"case": case, "layers": layers, "heads_per_layer": heads, "kv_heads_per_layer": kv_heads,
               "heads": layers * heads, "new_ms": round(new_ms, 2), "new_cpu_ms": round(new_cpu_ms, 2),
               "dropped": sum(len(v) for v in new.values()), "kept_flops_share": round(
                   costs.cost({k: [h for h in range(64) if h not in set(new.get(k, []))] for k in scores})
                   / costs.total(), 4)}
        slow = layers * heads > (2000 if case == "free" else 1000)
        if not args.quick and not slow:
            old_ms, _, old = timed(lambda s=scores, c=costs, case=case: select_old(case, s, c, args.share), 1)
            row |= {"old_ms": round(old_ms, 1), "speedup": round(old_ms / new_ms, 1), "same_selection": old == new}
        rows.append(row)
        print(json.dumps(row))
    record = {"benchmark": "selection_speed", "share": args.share, "repeats": args.repeats, "goal_ms": 50,
              "rows": rows, "machine": {"platform": platform.platform(), "processor": platform.processor(),
                                        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                        "load_average_1_5_15_min": os.getloadavg()},
              "versions": versions(), "command": "python benchmarks/selection_speed.py"}
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
