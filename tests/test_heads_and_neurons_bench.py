"""benchmarks/heads_and_neurons.py: its quick run writes a complete record, its statistics match
references, and the manual's table (docs/compression.md) is what the committed results say."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("heads_and_neurons", ROOT / "benchmarks" / "heads_and_neurons.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
COMMITTED = ROOT / "benchmarks" / "results" / "heads_and_neurons.json"


def test_quick_run_writes_every_budget_with_tests_and_speed(tmp_path):
    out = tmp_path / "r.json"
    bench.main(["--quick", "--out", str(out), "--repeats", "1"])
    entry = json.loads(out.read_text())["quick"]
    assert [r["model_flops_budget"] for r in entry["budgets"]] == [0.6, 0.5, 0.4]
    for r in entry["budgets"]:
        assert r["model_flops_kept"] <= r["model_flops_budget"] + 1e-9
        assert r["p_holm"] >= r["p_value"] and r["speedup"] > 0 and "reconstruct" in r["stages"]
        assert r["vs_unpruned"]["ci_low"] <= r["score"] - entry["unpruned"] <= r["vs_unpruned"]["ci_high"]
    assert set(entry["signature"]) >= {"model", "data", "calib_n", "fit_n", "val_n", "seed", "versions"}
    assert entry["signature"]["fit_n"] > entry["signature"]["calib_n"]
    assert all(r["stages"]["reconstruct"] != "skipped" for r in entry["budgets"])
    # the reported test of today's code, and Holm over the budgets by hand (step-down, then running max)
    assert all(bench.current_test(r) for r in entry["budgets"])
    p = [r["p_value"] for r in entry["budgets"]]
    order = sorted(range(len(p)), key=p.__getitem__)
    running, holm = 0.0, [0.0] * len(p)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        holm[i] = running
    assert [r["p_holm"] for r in entry["budgets"]] == pytest.approx(holm)


def test_rows_of_retired_tests_show_scores_only():
    row = {"model_flops_kept": 0.6, "heads_kept": [5, 6], "neurons_kept": [7, 8], "score": 0.8, "relative": 0.9,
           "p_holm": 0.01, "speedup": 1.5, "speedup_detail": {}, "compress_seconds": 3.0, "stages": {},
           "vs_unpruned": {"test": "paired bootstrap (corpus BLEU)", "ci_low": -0.1, "ci_high": 0.0}}
    entry = {"metric": "accuracy", "unpruned": 0.9, "budgets": [row]}
    assert bench._rows({"sst2": entry})[1][5:7] == ["retired test", "retired test"]
    row["vs_unpruned"]["test"] = "McNemar mid-p (paired correctness)"
    assert bench._rows({"sst2": entry})[1][5:7] == ["[-10.0%, 0.0%]", "0.01"]


def test_readme_table_is_what_the_committed_results_say():
    results = json.loads(COMMITTED.read_text())
    assert bench.readme_block(ROOT / "docs" / "compression.md") == bench.readme_section(results, bench.earlier_runs(), bench.later_runs())


def test_tuning_diagnosis_table_is_what_the_committed_results_say():
    spec = importlib.util.spec_from_file_location("tuning_diagnosis", ROOT / "benchmarks" / "tuning_diagnosis.py")
    diag = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diag)
    results = json.loads((ROOT / "benchmarks" / "results" / "tuning_diagnosis.json").read_text())
    assert diag.readme_block(ROOT / "docs" / "compression.md") == diag.readme_section(results)
    assert diag.reduction([{"error_unit": 10.0, "error_tuned": 9.0}, {"error_before": 4.0, "error_after": 1.0},
                           {"error_unit": 2.0, "error_tuned": 1.0}]) == pytest.approx(0.5)


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fit_size_and_distill_selection_quick_runs_write_what_the_readme_quotes(tmp_path):
    fit = _load("fit_size").main(["--quick", "--out", str(tmp_path / "fit.json")])["quick"]
    assert [r["fit_examples"] for r in fit["rows"]] == [0, 16, 32]
    assert all(r["kl"] >= 0 and 0 <= r["agreement"] <= 1 and r["n"] == 16 for r in fit["rows"])
    sel = _load("distill_selection").main(["--quick", "--lrs", "1e-5,1e-4", "--out", str(tmp_path / "d.json")])
    rows = sel["quick"]["rows"]
    assert [r["lr"] for r in rows] == [0.0, 1e-5, 1e-4] and all(r["kl"] >= 0 for r in rows)
    assert json.loads((tmp_path / "d.json").read_text())["quick"]["rows"] == rows
    committed = json.loads((ROOT / "benchmarks" / "results" / "distill_selection.json").read_text())
    assert set(committed) == {"sst2", "enfr"} and all(e["fit_examples"] == 4096 for e in committed.values())


def test_reconstruct_speed_quick_run_compares_the_two_paths_on_one_fit(tmp_path):
    out = _load("reconstruct_speed").main(["--quick", "--out", str(tmp_path / "r.json")])
    (row,) = out["rows"]
    assert row["max_relative_weight_difference"] <= 1e-6 and row["seconds_layerwise"] > 0
    assert row["speedup"] == pytest.approx(row["seconds_whole_model"] / row["seconds_layerwise"])
