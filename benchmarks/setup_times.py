"""Time the README's two set-up commands on a fresh clone, and the disk they use.

    python benchmarks/setup_times.py [--only test|demo] [-o benchmarks/results/setup_times.json]

Clones this repository's HEAD into a temporary folder and runs `make test` there (with
HEADPRUNE_SHARED_DATA when it is set, as CI does), then `make demo` in a second fresh clone. Records
the wall time and exit status of each, the machine (cores, load average before, during (every 30 s: mean and
maximum) and after: a busy machine is slower, and the figure says how busy it was), and the disk each leaves behind: the
virtual environment, the demo's run directory and its saved pruned model. The README quotes these.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_results import demo_record  # noqa: E402
from recorded import repo_path  # noqa: E402


def _du(path: Path) -> int:
    """Bytes under ``path`` (files only, links not followed)."""
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _clone(into: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(ROOT), str(into)], check=True)
    return into


def _run_make(target: str, clone: Path) -> dict:
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    log = clone / f"make-{target}.log"
    loads = []  # the 1-minute load average every 30 s while it runs: the load before says little about a 15-minute run
    with log.open("w") as out:
        proc = subprocess.Popen(["make", target], cwd=clone, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                loads.append(os.getloadavg()[0])
        rc = proc.returncode
    seconds = time.perf_counter() - started
    tail = log.read_text().splitlines()[-3:]
    kept = Path(tempfile.gettempdir()) / f"headprune-make-{target}.log"  # the clone goes; its log stays here
    kept.write_text(log.read_text())
    return {"command": f"make {target}", "exit": rc, "seconds": round(seconds, 1),
            "load_1min_before": round(load_before, 2), "load_1min_after": round(os.getloadavg()[0], 2),
            "load_1min_during": {"samples": len(loads), "mean": round(sum(loads) / len(loads), 2) if loads else None,
                                 "max": round(max(loads), 2) if loads else None},
            "last_lines": tail}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["test", "demo"], default=None)
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "benchmarks/results/setup_times.json")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    result = {"machine": {"cores": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version()},
              "commit": commit, "shared_data": repo_path(os.environ.get("HEADPRUNE_SHARED_DATA", "")) or None, "runs": {}}
    for target in ("test", "demo"):
        if args.only not in (None, target):
            continue
        with tempfile.TemporaryDirectory(prefix=f"headprune-{target}-") as tmp:
            clone = _clone(Path(tmp) / "headprune")
            print(f"make {target} in a fresh clone ({clone}) ...", flush=True)
            run = _run_make(target, clone)
            run["commit"] = commit
            run["disk_bytes"] = {"venv": _du(clone / ".venv")}
            if target == "demo":
                run["disk_bytes"]["runs/demo"] = _du(clone / "runs/demo")
                run["disk_bytes"]["runs/demo/pruned_model"] = _du(clone / "runs/demo/pruned_model")
                if run["exit"] == 0:  # the demo's own figures, which README quotes, from this very run
                    record = demo_record(clone / "runs/demo", f"{os.cpu_count()} CPU cores, `make demo` in a fresh "
                                         f"clone (1-min load {run['load_1min_before']} before)", "make demo")
                    (ROOT / "benchmarks/results/demo.json").write_text(json.dumps(record, indent=2) + "\n")
            print(f"  exit {run['exit']} after {run['seconds']:.0f} s", flush=True)
            result["runs"][target] = run
    if args.output.exists() and args.only:
        old = json.loads(args.output.read_text())
        result["runs"] = {**old.get("runs", {}), **result["runs"]}
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return max((r["exit"] for r in result["runs"].values()), default=0)


if __name__ == "__main__":
    sys.exit(main())
