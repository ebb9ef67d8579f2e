"""1 vs 2 processes (torchrun, gloo, 1 thread each) on the same command: wall time, ratio, scaling
efficiency, and whether the results are identical.

    python benchmarks/multiprocess_speed.py --model runs/sst2-minilm/final     # ~5 min on 2 cores

Tasks, on the MiniLM SST-2 classifier (6 layers x 12 heads) that ``headprune train classifier`` writes:
``headprune importance`` over the first 512 training examples (data-parallel sums) and ``headprune ablate``
(the one-head sweep, 72 units split across ranks) on the first 256 dev examples. Each command is timed
whole, as a user runs it (process start-up, model load and the rank-0 writing included); ``startup``
times ``headprune --version`` the same way, the fixed cost a second process adds. Efficiency =
t1 / (2 * t2). Writes benchmarks/results/multiprocess_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import opening, repo_path, repo_word  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HEADPRUNE_SHARED_DATA", ROOT.parent / "shared" / "data"))


def launcher(processes: int) -> list[str]:
    if processes == 1:
        return [sys.executable, "-m", "headprune"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            "-m", "headprune"]


def timed(cmd: list[str]) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed: {shlex.join(cmd)}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=ROOT / "runs" / "sst2-minilm" / "final")
    ap.add_argument("--importance-examples", type=int, default=512)
    ap.add_argument("--sweep-examples", type=int, default=256)
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "multiprocess_speed.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hp-mp-"))
    tasks = {
        "startup": lambda out: ["--version"],
        "importance": lambda out: ["importance", str(args.model), "--task", "classification", "--data",
                                   str(DATA / "sst2" / "train.tsv"), "--calib-limit", str(args.importance_examples),
                                   "--device", "cpu", "-o", str(out), "--quiet"],
        "ablate": lambda out: ["ablate", str(args.model), "--task", "classification", "--data",
                               str(DATA / "sst2" / "dev.tsv"), "--limit", str(args.sweep_examples),
                               "--device", "cpu", "-o", str(out)],
    }
    rows = {}
    start_load = os.getloadavg()
    for name, build in tasks.items():
        seconds = {}
        for processes in (1, 2):
            out = work / f"{name}-{processes}"
            seconds[processes] = timed(launcher(processes) + build(out))
            print(f"{name}: {processes} process(es) {seconds[processes]:.1f} s", flush=True)
        row = {"seconds_1": seconds[1], "seconds_2": seconds[2], "speedup": seconds[1] / seconds[2],
               "efficiency": seconds[1] / (2 * seconds[2]),
               "command": shlex.join(["headprune", *map(repo_word, build(Path("OUT")))])}
        if name == "importance":
            one = json.loads((work / "importance-1" / "importance.json").read_text())["scores"]
            two = json.loads((work / "importance-2" / "importance.json").read_text())["scores"]
            row["max_relative_difference"] = max(
                float((torch.tensor(two[s]) - torch.tensor(one[s])).abs().max() / torch.tensor(one[s]).abs().max())
                for s in one)
        if name == "ablate":
            row["identical_csv"] = all((work / "ablate-1" / f).read_text() == (work / "ablate-2" / f).read_text()
                                       for f in ("ablation.csv", "ablation_by_damage.csv"))
        rows[name] = row
    head = opening("1 vs 2 processes (torchrun --standalone, gloo, OMP_NUM_THREADS=1 each)", __file__, load=False,
                   label="benchmark")
    head["machine"] |= {"loadavg_start": list(start_load), "loadavg_end": list(os.getloadavg())}
    result = {**head, "model": repo_path(args.model), "importance_examples": args.importance_examples,
              "sweep_examples": args.sweep_examples, "tasks": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
