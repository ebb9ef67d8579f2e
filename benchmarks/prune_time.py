"""Pruning time of headprune's selected LLM configuration against FLAP's, measured in the same invocation at
every budget (issue #34 item 5: "prunes SmolLM2 within 3x FLAP's time").

    python benchmarks/prune_time.py                     # SmolLM2-135M, 10/20/30/50%, writes benchmarks/results/prune_time.json
    python benchmarks/prune_time.py --quick             # the tiny random GQA Llama of llm_peers --quick (seconds)
    python benchmarks/prune_time.py --write-docs docs/peers.md   # the table between this file's markers

Both methods see the model, calibration batches (``benchmarks/llm_peers.py``'s: 32 blocks of 256 tokens of the
WMT21 de-en English references) and budget of the peer comparison; a workload is the whole pruning -- scores
from the calibration data, the selection, the compensation and the surgery on a copy of the model -- timed
with the project's speed protocol (:func:`headprune.bench.protocol.paired_rounds`: FLAP and headprune in
alternating rounds, the median ratio with its distribution-free interval, the machine's load before and after;
a budget whose load exceeded the cores is marked unreliable and the docs say so instead of quoting it).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_peers  # noqa: E402
from doc_tables import markdown_table  # noqa: E402
from peers.flap import flap_plan  # noqa: E402
from peers.headprune_rows import CONFIGURATIONS, headprune_row  # noqa: E402
from peers.results_io import save, write_section  # noqa: E402
from recorded import opening  # noqa: E402

from headprune.bench.protocol import ProtocolSettings, paired_rounds  # noqa: E402
from headprune.compression.replay import apply_plan  # noqa: E402
from headprune.evaluation.lm import LanguageModelling  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "prune_time.json"
BEGIN, END = "<!-- prune_time.json: begin -->", "<!-- prune_time.json: end -->"
SELECTED = "selected"  # per budget, the configuration llm_peers.json selects there (held-out blocks)
GOAL = 3.0  # headprune's pruning time at most GOAL x FLAP's


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budgets", default="0.1,0.2,0.3,0.5", help="Shares of non-embedding parameters removed.")
    p.add_argument("--rounds", type=int, default=2, help="Alternating rounds per budget (each prunes with both).")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--config", default=SELECTED, help="headprune's configuration (benchmarks/peers/headprune_rows.py), "
                   "or 'selected': at each budget the one benchmarks/results/llm_peers.json selects there.")
    p.add_argument("--quick", action="store_true", help="The tiny random GQA Llama of llm_peers --quick.")
    p.add_argument("--update", action="store_true", help="Keep the budgets of --output not measured now (same "
                   "model and calibration); each budget records the command that measured it.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--write-docs", type=Path, default=None, help="Write the table from the JSON into this page, exit.")
    return p.parse_args(argv)


def _workloads(model, batches, budget: float, config: str) -> dict:
    """{name: callable returning the seconds one whole pruning took}."""
    def flap() -> float:
        start = time.perf_counter()
        apply_plan(copy.deepcopy(model), flap_plan(model, batches, budget))
        return time.perf_counter() - start

    def headprune() -> float:
        start = time.perf_counter()
        headprune_row(config, model, batches, budget)
        return time.perf_counter() - start
    return {"flap": flap, "headprune": headprune}


def main(argv=None) -> dict | None:
    args = parse(argv)
    if args.write_docs:
        write_docs(args.write_docs, json.loads(OUTPUT.read_text()))
        return None
    budgets = llm_peers._numbers(args.budgets, "--budgets", float, lambda v: 0 < v < 1,
                                 "comma-separated numbers in (0, 1)")
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}; allowed: an integer >= 1")
    head = opening("prune_time", __file__, argv, threads=args.threads, python=True)
    peer_args = llm_peers.parse(["--quick"] if args.quick else [])
    model, tok, calib_text, _, described = llm_peers.load(peer_args)
    block, blocks = (64, 8) if args.quick else (peer_args.calib_block, peer_args.calib_blocks)
    calib = LanguageModelling(tok, [calib_text], block_size=block, max_blocks=blocks, batch_size=4)
    batches = list(calib.batches(limit=blocks))
    output = args.output or (OUTPUT.with_name("prune_time_quick.json") if args.quick else OUTPUT)
    out = {**head,
           "settings": {**described, "calib_block": block, "calib_blocks": blocks, "config": args.config,
                        "rounds": args.rounds, "threads": args.threads, "goal": f"headprune <= {GOAL} x FLAP",
                        "workload": "scores + selection + compensation + surgery on a copy", "seed": 0},
           "budgets": _kept_budgets(output, described) if args.update else {}}
    protocol = ProtocolSettings(min_rounds=args.rounds, max_rounds=args.rounds, budget_s=0.0, warmup=0,
                                threads=args.threads)
    for budget in budgets:
        config = configuration(args.config, budget, args.quick)
        print(f"budget {budget:.0%}: FLAP and {config}, {args.rounds} alternating round(s)", flush=True)
        timed = paired_rounds(_workloads(model, batches, budget, config), "headprune", protocol)
        ratio = timed["ratios"]["flap"]  # headprune's seconds / FLAP's, per round
        out["budgets"][str(budget)] = {"config": config, "command": out["command"], "rounds": args.rounds,
                                       "seconds": timed["seconds"], "median_s": timed["median_s"],
                                       "headprune_over_flap": ratio, "within_goal": ratio["high"] <= GOAL,
                                       "load": timed["load"], "reliable": timed["reliable"], "reason": timed["reason"]}
        print(f"  FLAP {timed['median_s']['flap']:.1f} s, headprune {timed['median_s']['headprune']:.1f} s, "
              f"ratio {ratio['median']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}]"
              f"{'' if timed['reliable'] else ' (unreliable: ' + timed['reason'] + ')'}", flush=True)
        save(output, out)
    print(f"wrote {output}")
    return out


def _kept_budgets(output: Path, described: dict) -> dict:
    """The budgets already in ``output`` (``--update``), each with the command that measured it; refused where the
    file's model or calibration differ."""
    if not output.exists():
        return {}
    old = json.loads(output.read_text())
    if any(old["settings"].get(k) != v for k, v in described.items()):
        raise SystemExit(f"--update: {output} was measured on another model or calibration; allowed: a file of the "
                         "same settings, or no --update")
    return {b: {"command": old["command"], "config": old["settings"]["config"], "rounds": old["settings"]["rounds"],
                **row} for b, row in old["budgets"].items()}


def configuration(name: str, budget: float, quick: bool) -> str:
    """``name``, or for ``selected`` the configuration ``llm_peers.json`` selects at ``budget`` (the quick run:
    ``headprune-fisher+linear``, which its tiny model has no selection for)."""
    if name != SELECTED:
        if name not in CONFIGURATIONS:
            raise SystemExit(f"--config {name!r}; allowed: {SELECTED}, {', '.join(CONFIGURATIONS)}")
        return name
    if quick:
        return "headprune-fisher+linear"
    selected = json.loads(llm_peers.OUTPUT.read_text()).get("selected", {})
    if str(budget) not in selected:
        raise SystemExit(f"--budgets {budget}: {llm_peers.OUTPUT.name} selects no configuration there; allowed: "
                         f"{', '.join(selected)} or --config NAME")
    return selected[str(budget)]


def table(data: dict) -> str:
    """The docs table: per budget FLAP's and headprune's median seconds, the ratio with its interval."""
    s = data["settings"]
    lines = [f"Pruning time, {s['config']} configuration against FLAP, alternating rounds, "
             f"{s['threads']} thread(s), machine: {data['machine'].get('processor', '?')} "
             f"({data['machine'].get('cpu_count', '?')} cores); "
             + "; ".join(f"`{c}`" for c in dict.fromkeys(r.get("command", data["command"]) for r in data["budgets"].values()))
             + ".", ""]
    rows = []
    for budget, row in data["budgets"].items():
        r, load = row["headprune_over_flap"], row["load"]
        if row["reliable"]:
            cells = (f"{row['median_s']['flap']:.1f}", f"{row['median_s']['headprune']:.1f}",
                     f"{r['median']:.2f} [{r['low']:.2f}, {r['high']:.2f}]", "yes" if row["within_goal"] else "no")
        else:
            cells = ("not measured reliably",) * 3 + (f"({row['reason']})",)
        other = load.get("other_cpu")
        rows.append([f"{float(budget):.0%}", row.get("config", s["config"]), row.get("rounds", s["rounds"]), *cells,
                     "-" if other is None else f"{other:.2f}", f"{load['before']:.2f} / {load['after']:.2f}"])
    return "\n".join(lines + markdown_table(["budget", "configuration", "rounds", "FLAP s", "headprune s",
                                             "headprune / FLAP [interval]", "within 3x",
                                             "other processes' CPU (cores)", "load average before / after"], rows))


def write_docs(page: Path, data: dict) -> None:
    write_section(page, BEGIN, END, table(data))


if __name__ == "__main__":
    main()
