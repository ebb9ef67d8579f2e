"""The README's 1 vs 2 process figures, generated from the committed results file.

    python benchmarks/scale_readme.py docs/gpus.md    # rewrite the block between the scale markers

Reads benchmarks/results/multiprocess_speed.json (written by benchmarks/multiprocess_speed.py);
``tests/test_scale_readme.py`` checks the README holds exactly this text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
START, END = "<!-- scale:start -->", "<!-- scale:end -->"


def readme_section(speed: dict | None) -> str:
    lines = []
    if speed is not None:
        load = speed["machine"].get("loadavg_start") or []
        for name, label in (("importance", f"`importance` over {speed['importance_examples']} examples"),
                            ("ablate", f"`ablate` (72 heads, {speed['sweep_examples']} examples)")):
            row = speed["tasks"][name]
            if name == "ablate":
                same = "identical CSVs" if row["identical_csv"] else "CSVs DIFFER"
            else:
                diff = row["max_relative_difference"]
                same = "identical scores" if diff == 0 else f"scores within {diff:.1g} relative"
            lines.append(f"- **1 vs 2 processes**, {label} on the MiniLM SST-2 classifier: {row['seconds_1']:.0f} s vs "
                         f"{row['seconds_2']:.0f} s, speed-up {row['speedup']:.2f}, efficiency {row['efficiency']:.2f} "
                         f"({same}).")
        start = speed["tasks"]["startup"]
        busy = ", other jobs running" if load[0] >= 1 else ""
        lines.append(f"  Measured on a 2-core machine (1-minute load average {load[0]:.1f} at the start{busy}), whole "
                     f"commands timed, 1 thread per process: start-up alone is {start['seconds_1']:.0f} s vs "
                     f"{start['seconds_2']:.0f} s; `python benchmarks/multiprocess_speed.py`, "
                     "`benchmarks/results/multiprocess_speed.json`.")
    return "\n".join(lines)


def load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def current() -> str:
    return readme_section(load("multiprocess_speed.json"))


def readme_block(readme: Path) -> str:
    return readme.read_text().split(START, 1)[1].split(END, 1)[0].strip("\n")


def write_readme(readme: Path) -> None:
    text = readme.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{current()}\n{END}{tail}")


if __name__ == "__main__":
    write_readme(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "gpus.md")
