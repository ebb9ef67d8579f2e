"""``benchmarks/prune_time.py``: FLAP and headprune's selected configuration pruned in alternating rounds at every
budget; the ratio is the per-round quotient of the seconds it records, and the docs table is what the committed
JSON says (unreliable budgets never quoted)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from scripts import benchmark_script

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return benchmark_script("prune_time")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("pt") / "prune_time.json"
    _module().main(["--quick", "--budgets", "0.3", "--rounds", "2", "--output", str(out)])
    return json.loads(out.read_text())


def test_the_ratio_is_headprune_seconds_over_flap_seconds_per_round(quick):
    row = quick["budgets"]["0.3"]
    per_round = [h / f for h, f in zip(row["seconds"]["headprune"], row["seconds"]["flap"], strict=True)]
    assert len(per_round) == 2
    assert row["headprune_over_flap"]["median"] == pytest.approx(statistics.median(per_round), rel=1e-12)
    assert row["within_goal"] == (row["headprune_over_flap"]["high"] <= 3.0)
    assert set(row["load"]) >= {"before", "after", "cores", "reliable"}
    assert quick["settings"]["config"] == "selected" and row["config"] == "headprune-fisher+linear"


def test_unreliable_budgets_are_not_quoted(quick):
    mod = _module()
    data = json.loads(json.dumps(quick))
    row = data["budgets"]["0.3"]
    row["reliable"], row["reason"] = False, "load of other processes 9.00 + 1 benchmark thread(s) > 2 usable core(s)"
    text = mod.table(data)
    assert "not measured reliably" in text and f"{row['median_s']['flap']:.1f} |" not in text
    row["reliable"] = True
    assert f"{row['headprune_over_flap']['median']:.2f} [" in mod.table(data)


def test_bad_budget_is_one_line():
    with pytest.raises(SystemExit, match="--budgets"):
        _module().main(["--quick", "--budgets", "1.5"])


def test_the_docs_table_is_the_committed_json():
    mod = _module()
    data = json.loads((ROOT / "benchmarks" / "results" / "prune_time.json").read_text())
    section = (ROOT / "docs" / "peers.md").read_text().split(mod.BEGIN, 1)[1].split(mod.END, 1)[0].strip()
    assert section == mod.table(data), "run: python benchmarks/prune_time.py --write-docs docs/peers.md"
    assert set(data["budgets"]) == {"0.1", "0.2", "0.3", "0.5"}


def test_update_keeps_the_other_budgets_with_their_command(quick, tmp_path):
    out = tmp_path / "prune_time.json"
    out.write_text(json.dumps(quick))
    _module().main(["--quick", "--budgets", "0.2", "--rounds", "1", "--update", "--output", str(out)])
    data = json.loads(out.read_text())
    assert set(data["budgets"]) == {"0.2", "0.3"}
    assert data["budgets"]["0.3"]["seconds"] == quick["budgets"]["0.3"]["seconds"]
    assert data["budgets"]["0.3"]["command"] == quick["command"] != data["budgets"]["0.2"]["command"]
    assert "--update" in data["budgets"]["0.2"]["command"] and data["budgets"]["0.2"]["rounds"] == 1
