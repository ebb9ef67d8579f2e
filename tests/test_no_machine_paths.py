"""Committed results and the manual hold no absolute path of the machine they were made on (a checkout's folder,
a scratch folder, a virtual environment's python): commands are recorded as ``python benchmarks/X.py ...`` with
paths relative to the repository root (``benchmarks/recorded.py``), a run's files by their own names."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from recorded import command, repo_path  # noqa: E402

# an absolute path under a folder that differs from machine to machine (a user's home, a workspace, a scratch
# or mounted folder; not the tail of a URL or of a relative path), any virtual environment's python, or a Windows
# user folder. System files that are the same everywhere (/proc/stat, /dev/null) are not the machine's.
ROOTS = "work|tmp|home|root|Users|mnt|media|scratch|data|srv|opt|var|private|workspace|content|kaggle|gpfs|lustre|nfs"
ABSOLUTE = re.compile(rf"(?<![\w.~/:\\-])/(?:{ROOTS})/[^\s\"'`,;)\]}}]*|(?<![\w.~/:\\-])/[^\s\"'`]*/bin/python[\d.]*"
                      r"|\b[A-Za-z]:\\\\?(?:Users|home)\b")
SUFFIXES = (".json", ".jsonl", ".md", ".csv", ".html", ".txt", ".toml")


def committed_text_files() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "REPRODUCTION.md"]
    for folder in ("benchmarks/results", "studies/results", "docs"):
        found += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    return found


def machine_paths(text: str) -> list[str]:
    return sorted(set(ABSOLUTE.findall(text)))


@pytest.mark.parametrize("text, found", [
    ('"command": "/work/main/.venv/bin/python benchmarks/x.py --cache /tmp/rec/cache"',
     ["/tmp/rec/cache", "/work/main/.venv/bin/python"]),
    ("--data=/home/me/dev.tsv", ["/home/me/dev.tsv"]),
    ("C:\\\\Users\\\\me\\\\model", ["C:\\\\Users"]),
    ("/usr/local/venv/bin/python3.11 -m x", ["/usr/local/venv/bin/python3.11"]),
    ("see https://github.com/a/b and runs/sst2-minilm/final, 3 tokens/s, ../shared/data/sst2, /proc/stat", []),
])
def test_the_scan_finds_absolute_paths_and_nothing_else(text, found):
    assert machine_paths(text) == found


def test_committed_results_and_docs_hold_no_machine_paths():
    files = committed_text_files()
    assert len(files) > 50  # the folders are where this test thinks they are
    found = {str(p.relative_to(ROOT)): machine_paths(p.read_text(encoding="utf-8", errors="replace")) for p in files}
    found = {k: v for k, v in found.items() if v}
    assert not found, "absolute machine paths (record them relative to the repository root, see " \
                      f"benchmarks/recorded.py): {found}"


def test_recorded_commands_are_relative_to_the_repository_root(tmp_path):
    script = ROOT / "benchmarks" / "prune_time.py"
    got = command(script, ["--out", str(ROOT / "runs" / "x.json"), f"--data={ROOT.parent / 'shared' / 'dev.tsv'}",
                           "--cache", str(tmp_path / "deep" / "cache"), "--budgets", "0.1,0.2", "two words"])
    assert got == ("python benchmarks/prune_time.py --out runs/x.json --data=../shared/dev.tsv --cache cache "
                   "--budgets 0.1,0.2 'two words'")
    assert repo_path(ROOT) == "." and repo_path("relative/dir") == "relative/dir"
    assert not machine_paths(got)
