"""Copy what the README quotes from a demo run directory into benchmarks/results/demo.json.

    python benchmarks/demo_results.py RUN_DIR [--machine TEXT] [-o benchmarks/results/demo.json]

    python benchmarks/demo_results.py RUN_DIR --check   # does the run reproduce what README.md quotes?

RUN_DIR is what `headprune demo` (or `make demo`) wrote (runs/demo by default): its results.json and
ablation/results.json. benchmarks/setup_times.py calls this after timing `make demo` in a fresh clone.
``--check`` (the last step of `make demo`) compares the run with the committed record README.md quotes:
the same heads removed, and perplexities within 0.1% (float rounding differs between CPUs; the README
quotes two decimals); exit 1 naming each difference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def demo_record(run: Path, machine: str, command: str = "headprune demo") -> dict:
    """The fields of a demo run that README.md quotes (studies/quotes.py ``demo:FIELD``)."""
    res = json.loads((run / "results.json").read_text())
    ablation = json.loads((run / "ablation" / "results.json").read_text())
    sig = res["signature"]
    heads_total = sum(len(v) for v in res["importance"].values())
    return {
        "benchmark": "demo",
        "command": f"{command}  (fields copied from the run's results.json and ablation/results.json)",
        "machine": machine,
        "model": sig.get("model"), "data": sig.get("data"), "split": sig.get("split"),
        "block_size": sig.get("block_size"), "versions": sig.get("versions"),
        "heads_total": heads_total,
        "heads_removed": sum(len(v) for v in res["pruned_heads"].values()),
        "prune_fraction": res["prune_fraction"], "max_ppl_increase": res.get("max_ppl_increase"),
        "perplexity": res["perplexity"], "perplexity_on": res.get("perplexity_on"),
        "pruned_vs_masked": res.get("pruned_vs_masked"),
        "parameters": res["parameters"],
        "kv_cache_bytes_per_token": res.get("kv_cache_bytes_per_token"),
        "speed": res["speed"],
        "ablation": {"heads": len(ablation["rows"]), "base": ablation["base"], "headline": ablation.get("headline")},
        "headline": res["headline"],
        "seconds": res["seconds"],
    }


def machine_text() -> str:
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} CPU cores ({platform.machine()}), 1-min load {load:.1f} when recorded"


PPL_RTOL = 1e-3  # perplexities of a rerun vs the committed record


def reproduces(run: Path, committed: dict) -> list[str]:
    """What differs between a demo run and the committed record (empty: it reproduces the README's numbers)."""
    got = demo_record(run, "")
    problems = []
    if got["heads_removed"] != committed["heads_removed"] or got["heads_total"] != committed["heads_total"]:
        problems.append(f"heads removed: {got['heads_removed']} of {got['heads_total']}, the README quotes "
                        f"{committed['heads_removed']} of {committed['heads_total']}")
    for key in ("unpruned", "masked", "pruned"):
        a, b = got["perplexity"][key], committed["perplexity"][key]
        if not abs(a - b) <= PPL_RTOL * abs(b):
            problems.append(f"perplexity {key}: {a:.4f}, the README's record has {b:.4f} (allowed: within "
                            f"{PPL_RTOL:.1%})")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--machine", default=None)
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "benchmarks/results/demo.json")
    parser.add_argument("--check", action="store_true", help="compare the run with --output; write nothing")
    args = parser.parse_args()
    if args.check:
        committed = json.loads(args.output.read_text())
        problems = reproduces(args.run, committed)
        for line in problems:
            print(f"demo check: {line}")
        if problems:
            raise SystemExit(1)
        got = demo_record(args.run, "")
        print(f"demo check: the run reproduces README.md's numbers ({got['heads_removed']} of {got['heads_total']} "
              f"heads removed; held-out perplexity {got['perplexity']['unpruned']:.2f} -> "
              f"{got['perplexity']['pruned']:.2f})")
        return
    record = demo_record(args.run, args.machine or machine_text())
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
