"""benchmarks/llm_compression.py: the quick run's rows, and the manual's table (docs/llms.md) from the committed results."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("llm_compression", ROOT / "benchmarks" / "llm_compression.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_every_point_and_never_grows_the_cache(tmp_path):
    bench = _script()
    out = bench.main(["--quick", "--output", str(tmp_path / "q.json")])
    data = json.loads((tmp_path / "q.json").read_text())
    assert data["rows"] == json.loads(json.dumps(out["rows"]))
    assert {(r["method"], r["fraction"]) for r in data["rows"]} == {(m, f) for m in bench.METHODS for f in bench.FRACTIONS}
    base = data["unpruned"]["perplexity"]
    nll, tokens = sum(data["unpruned"]["nll_sum"]), sum(data["unpruned"]["tokens"])
    assert math.isclose(base, math.exp(nll / tokens), rel_tol=1e-9)
    for r in data["rows"]:
        assert r["heads_removed"] <= round(r["fraction"] * r["of"])
        assert math.isclose(r["relative"], r["perplexity"] / base, rel_tol=1e-6)
        assert r["relative_ci95"][0] <= r["relative"] <= r["relative_ci95"][1]
        kv = r["kv_cache_bytes_per_token"]
        assert kv["after"] <= kv["before"]
    again = bench.main(["--quick", "--output", str(tmp_path / "q.json")])  # resumes: nothing recomputed
    assert again["rows"] == out["rows"]


def test_readme_table_is_the_committed_results():
    bench = _script()
    committed = json.loads((ROOT / "benchmarks" / "results" / "llm_compression.json").read_text())
    assert bench.readme_block(ROOT / "docs" / "llms.md") == bench.readme_section(committed, bench.free_results())
    for r in committed["rows"]:  # uniform GQA: the KV cache never grows
        assert r["kv_cache_bytes_per_token"]["after"] <= r["kv_cache_bytes_per_token"]["before"]
