"""Copy what the README quotes from a demo run directory into benchmarks/results/demo.json.

    python benchmarks/demo_results.py RUN_DIR [--machine TEXT] [-o benchmarks/results/demo.json]

    python benchmarks/demo_results.py RUN_DIR --check   # does the run reproduce what README.md quotes?

RUN_DIR is what `headprune demo` (or `make demo`) wrote (runs/demo by default): its results.json and
ablation/results.json. benchmarks/setup_times.py calls this after timing `make demo` in a fresh clone.
``--check`` (the last step of `make demo`) compares the run with the committed record README.md quotes:
the same heads removed, and perplexities within 0.1% (float rounding differs between CPUs; the README
quotes two decimals) -- act one's, and act two's (headprune and FLAP at 20% of the non-embedding parameters
removed, headprune's after recovery, with its tokens) -- and both Q8_0 GGUF files of act two within 0.1% of
their bytes; exit 1 naming each difference.
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
        "act_two": act_two_record(res["act_two"]),
        "seconds": res["seconds"],
    }


def act_two_record(second: dict) -> dict:
    """What README.md quotes of act two: headprune and FLAP at the budget (perplexity, its ratio to the unpruned
    one with the interval, parameters kept), the recovery (tokens, minutes, perplexity) and the Q8_0 file sizes."""

    def method(row: dict) -> dict:
        return {k: row[k] for k in ("perplexity", "removed_share", "nonembedding_params", "ratio", "seconds")}

    gguf = second["gguf"]
    return {
        "budget": second["budget"], "configuration": second["configuration"],
        "unpruned": {k: second["unpruned"][k] for k in ("perplexity", "nonembedding_params")},
        "headprune": method(second["headprune"]), "flap": method(second["flap"]),
        "headprune_vs_flap": second["headprune_vs_flap"],
        "recovered": {k: second["recovered"][k] for k in ("perplexity", "tokens", "steps", "lr", "minutes", "ratio")},
        "gguf_bytes": {"unpruned": gguf["original"]["bytes"], "pruned": gguf["pruned"]["bytes"]} if "pruned" in gguf
        else None,
        "llama_cpp": gguf.get("llama_cpp", gguf.get("skipped")),
        "curve": [{k: r[k] for k in ("method", "budget", "removed_share", "perplexity")} for r in second["rows"]],
        "summary": second["summary"],
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
    pairs = [(f"perplexity {key}", got["perplexity"][key], committed["perplexity"][key])
             for key in ("unpruned", "masked", "pruned")]
    if "act_two" not in committed:  # a record made before act two: run `python benchmarks/demo_results.py RUN`
        problems.append("act two: the committed record has none (regenerate it from a run of today's demo)")
    else:
        problems += act_two_problems(got["act_two"], committed["act_two"], pairs)
    for what, a, b in pairs:
        if not abs(a - b) <= PPL_RTOL * abs(b):
            shown = [f"{x:,}" if isinstance(x, int) else f"{x:.4f}" for x in (a, b)]
            problems.append(f"{what}: {shown[0]}, the README's record has {shown[1]} (allowed: within {PPL_RTOL:.1%})")
    return problems


def act_two_problems(mine: dict, theirs: dict, pairs: list) -> list[str]:
    """Act two's differences that are not a matter of tolerance; its numbers to compare are added to ``pairs``."""
    problems = []
    pairs += [(f"act two: perplexity {key}", mine[key]["perplexity"], theirs[key]["perplexity"])
              for key in ("headprune", "flap", "recovered")]
    if mine["recovered"]["tokens"] != theirs["recovered"]["tokens"]:
        problems.append(f"act two: recovery on {mine['recovered']['tokens']:,} tokens, the README's record on "
                        f"{theirs['recovered']['tokens']:,}")
    if (mine["gguf_bytes"] is None) != (theirs["gguf_bytes"] is None):
        problems.append(f"act two: GGUF files {'not ' if mine['gguf_bytes'] is None else ''}written, the README's "
                        f"record {'has none' if theirs['gguf_bytes'] is None else 'has them'}")
    elif mine["gguf_bytes"] is not None:
        pairs += [(f"act two: Q8_0 bytes, {key}", mine["gguf_bytes"][key], theirs["gguf_bytes"][key])
                  for key in ("unpruned", "pruned")]
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
        second = got["act_two"]
        print(f"demo check: the run reproduces README.md's numbers ({got['heads_removed']} of {got['heads_total']} "
              f"heads removed; held-out perplexity {got['perplexity']['unpruned']:.2f} -> "
              f"{got['perplexity']['pruned']:.2f}; {second['budget']:.0%} removed: headprune "
              f"{second['headprune']['perplexity']:.2f}, FLAP {second['flap']['perplexity']:.2f}, recovered "
              f"{second['recovered']['perplexity']:.2f})")
        return
    record = demo_record(args.run, args.machine or machine_text())
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
