"""``benchmarks/aligned_cost.py``: the selected configuration at aligned and unaligned widths from one set of scores,
judged on held-out calibration blocks; every width an aligned row changed is a multiple of its block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import benchmark_script

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return benchmark_script("aligned_cost")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("ac") / "aligned_cost.json"
    _module().main(["--quick", "--budgets", "0.3", "--multiples", "1,16", "--output", str(out)])
    return json.loads(out.read_text())


def test_aligned_rows_change_widths_only_to_multiples_and_remove_at_least_the_target(quick):
    import llm_peers
    model, *_ = llm_peers.load(llm_peers.parse(["--quick"]))
    full_ffn, full_att = model.config.intermediate_size, model.config.num_attention_heads * model.config.head_dim
    rows = {r["multiple_of"]: r for r in quick["rows"]}
    assert set(rows) == {1, 16}
    ffn, att = rows[16]["widths"]["ffn"], rows[16]["widths"]["attention"]
    assert all(w == full_ffn or w % 16 == 0 for w in ffn) and all(w == full_att or w % 16 == 0 for w in att)
    assert any(w != full_ffn for w in ffn)
    assert any(w % 16 for w in rows[1]["widths"]["ffn"])  # the unaligned selection is not aligned by chance
    for r in rows.values():
        assert r["removed_share"] >= 0.3 - 0.01


def test_the_ratio_is_the_held_out_perplexities_quotient(quick):
    rows = {r["multiple_of"]: r for r in quick["rows"]}
    assert rows[1]["ratio_to_unaligned"] == pytest.approx(1.0, abs=1e-12)
    assert rows[16]["ratio_to_unaligned"] == pytest.approx(rows[16]["perplexity"] / rows[1]["perplexity"], rel=1e-9)
    lo, hi = rows[16]["ratio_ci95"]
    assert lo <= rows[16]["ratio_to_unaligned"] <= hi
    assert "| 30% | 16 |" in _module().table(quick)


def test_the_docs_table_is_the_committed_json():
    data = json.loads((ROOT / "benchmarks" / "results" / "aligned_cost.json").read_text())
    page = (ROOT / "docs" / "llms.md").read_text()
    mod = _module()
    section = page.split(mod.BEGIN, 1)[1].split(mod.END, 1)[0].strip()
    assert section == mod.table(data), "run: python benchmarks/aligned_cost.py --write-docs docs/llms.md"
    targets = {(r["budget"], r["multiple_of"]) for r in data["rows"]}
    assert targets == {(b, m) for b in (0.1, 0.2, 0.3, 0.5) for m in (1, 32, 64, 128, 256)}
