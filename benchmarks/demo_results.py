"""Copy what the README quotes from a demo run directory into benchmarks/results/demo.json.

    python benchmarks/demo_results.py RUN_DIR [--machine TEXT] [-o benchmarks/results/demo.json]

RUN_DIR is what `headprune demo` (or `make demo`) wrote (runs/demo by default): its results.json and
ablation/results.json. benchmarks/setup_times.py calls this after timing `make demo` in a fresh clone.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--machine", default=None)
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "benchmarks/results/demo.json")
    args = parser.parse_args()
    record = demo_record(args.run, args.machine or machine_text())
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
