"""docs/llm_export.md shows the pruned+quantised tables exactly as benchmarks/quantized_pruned.py renders
them from the committed benchmarks/results/quantized_pruned.json (regenerate: --write-doc)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "quantized_pruned.json"


@pytest.mark.skipif(not RESULTS.is_file(), reason="benchmarks/results/quantized_pruned.json not committed yet "
                    "(run python benchmarks/quantized_pruned.py)")
def test_doc_table_is_the_committed_results():
    spec = importlib.util.spec_from_file_location("quantized_pruned", ROOT / "benchmarks" / "quantized_pruned.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = json.loads(RESULTS.read_text())
    doc = (ROOT / "docs" / "llm_export.md").read_text()
    block = doc.split(bench.BEGIN, 1)[1].split(bench.END, 1)[0]
    assert block.strip() == bench.markdown(out).strip()
    assert out["model"].startswith("SmolLM2-135M") and {r["model"] for r in out["rows"]} == {"unpruned", "pruned"}
