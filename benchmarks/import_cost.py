"""What starting headprune costs: ``import headprune`` beside ``import transformers``, and ``headprune --version``.

    python benchmarks/import_cost.py             # 7 alternated rounds, about a minute
    python benchmarks/import_cost.py --quick     # 2 rounds, not written over the committed file

Each measurement is one fresh interpreter (``python -c ...`` or ``python -m headprune --version``), timed
from the parent with ``time.perf_counter`` around ``subprocess.run``, so it includes the interpreter's
own start; the rounds alternate the commands (A B C D, A B C D, ...) so drift of a shared machine hits
them alike, and each command's median over rounds is reported. ``import headprune`` reads its names on
first use (PEP 562), so it imports neither torch nor transformers; ``import headprune.core`` is the cost
of the library proper (torch + transformers + the core). Each child also reports whether torch and
transformers ended up in ``sys.modules``.
Writes benchmarks/results/import_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import command as recorded_command  # noqa: E402

ROOT = Path(__file__).resolve().parent
SRC = ROOT.parent / "src"
RESULTS = ROOT / "results" / "import_cost.json"
PROBE = "; import sys, json; print(json.dumps({m: m in sys.modules for m in ('torch', 'transformers')}))"
COMMANDS = {  # name -> argv after the interpreter
    "import headprune": ["-c", "import headprune" + PROBE],
    "import transformers": ["-c", "import transformers" + PROBE],
    "import headprune.core": ["-c", "import headprune.core" + PROBE],
    "headprune --version": ["-m", "headprune", "--version"],
}
MARGIN = 0.25  # seconds: what `import headprune` may cost above `import transformers`


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="2 rounds; writes only where --out says")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def run_once(args: list[str], env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return seconds, proc.stdout.strip()


def main(argv=None) -> dict:
    args = parse(argv)
    rounds = 2 if args.quick else args.rounds
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    loaded: dict[str, dict] = {}
    for _ in range(rounds):
        for name, command in COMMANDS.items():
            seconds, out = run_once(command, env)
            times[name].append(seconds)
            if out.startswith("{"):
                loaded[name] = json.loads(out.splitlines()[-1])
    median = {name: statistics.median(t) for name, t in times.items()}
    from headprune.provenance import versions  # light: no torch

    out = {
        "command": recorded_command(__file__, argv),
        "rounds": rounds,
        "median_s": {k: round(v, 4) for k, v in median.items()},
        "times_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "modules_loaded": loaded,
        "headprune_vs_transformers": round(median["import headprune"] / median["import transformers"], 3),
        "margin_s": MARGIN,
        "headprune_within_margin": median["import headprune"] <= median["import transformers"] + MARGIN,
        "versions": versions(),
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
    }
    for name, value in out["median_s"].items():
        print(f"{name:<24} {value:8.3f} s (median of {rounds})")
    if not args.quick or args.out != RESULTS:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
