"""The manual's (docs/gpus.md) 1 vs 2 process figures are what the committed results file says."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale_readme  # noqa: E402


def test_readme_scale_block_is_generated_from_the_results():
    assert scale_readme.load("multiprocess_speed.json") is not None
    assert scale_readme.readme_block(ROOT / "docs" / "gpus.md") == scale_readme.current()
