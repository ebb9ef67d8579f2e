"""``benchmarks/gpu_bench.py``: the dry run (CPU, tiny shapes) writes the schema the GPU run writes, with
pruned widths aligned, the parameter share removed as the widths imply, intervals around the ratios;
without CUDA and without --dry-run it writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_bench.py"
ROW_KEYS = {"shape", "fraction", "workload", "batch", "seq_len", "unit", "limit_kind", "throughput", "ratio",
            "ratio_low", "ratio_high", "coverage", "rounds", "limit", "efficiency", "reliable", "reason", "load",
            "seconds"}
TOP_KEYS = {"schema", "dry_run", "device", "dtype", "attn_implementation", "align", "fractions", "protocol",
            "versions", "command", "time_limit_s", "compress_limit_s", "seconds", "models", "rows", "table4",
            "paper_table4", "skipped", "compress", "compress_growth", "runs"}


def _env() -> dict:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_bench") / "gpu_bench.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


def _layer_params(config: dict, attention_width: int, ffn_width: int) -> int:
    """One Llama layer's weights from its widths, independently of the script: q and o (hidden x attention
    width), k and v (key/value heads x head_dim each), gate/up/down (hidden x FFN width), two norms."""
    h, kv = config["hidden_size"], config["num_key_value_heads"] * config["head_dim"]
    return 2 * h * attention_width + 2 * h * kv + 3 * h * ffn_width + 2 * h


def test_dry_run_writes_the_schema(dry):
    assert TOP_KEYS <= set(dry) and dry["dry_run"] is True and dry["schema"] == 2
    assert dry["skipped"] == [] and dry["attn_implementation"] == "sdpa"
    shapes = dry["models"]
    llms = [s for s in shapes if s != "bert-base"]
    # every shape x fraction x (2 prefill + 2 decode) workloads, and Table 4's batches
    assert len(dry["rows"]) == len(llms) * len(dry["fractions"]) * 4 and len(dry["table4"]) == 2
    for row in dry["rows"] + dry["table4"]:
        assert ROW_KEYS <= set(row), ROW_KEYS - set(row)
        assert row["ratio_low"] <= row["ratio"] <= row["ratio_high"] and 0 < row["coverage"] < 1
        assert row["throughput"]["unpruned"] > 0 and row["throughput"]["pruned"] > 0 and row["limit"] > 1
        assert isinstance(row["reliable"], bool) and (row["reliable"] or row["reason"])
        assert row["rounds"] >= 3 and len(row["seconds"]["pruned"]) == row["rounds"]
    assert {r["workload"] for r in dry["rows"]} == {"prefill", "decode"}
    assert [r["paper"] for r in dry["table4"]] == [dry["paper_table4"]["1"], dry["paper_table4"]["4"]]


def test_pruned_widths_are_aligned_and_remove_the_share_they_report(dry):
    align = dry["align"]
    for name, info in dry["models"].items():
        if name == "bert-base":
            continue
        config, unpruned = info["config"], info["unpruned"]
        base = sum(_layer_params(config, a, f) for a, f in zip(unpruned["attention_widths"], unpruned["ffn_widths"],
                                                                   strict=True))
        assert base == unpruned["non_embedding_params"] - config["hidden_size"]  # + the final norm
        for key, p in info["pruned"].items():
            assert p["aligned"] and all(w % align == 0 for w in p["attention_widths"] + p["ffn_widths"])
            kept = sum(_layer_params(config, a, f) for a, f in zip(p["attention_widths"], p["ffn_widths"], strict=True))
            assert p["share_removed"] == pytest.approx(1 - kept / base, rel=1e-3)
            assert abs(p["share_removed"] - float(key.rstrip("%")) / 100) < 0.1


def test_compress_rows_run_the_selected_configuration_and_remove_its_budget(dry):
    """Each budget's row runs the configuration llm_peers.json selects there, on every compress shape; the
    parameters it reports removed are what the budget asks, counted on the unpruned model's own parameters."""
    selected = json.loads((ROOT / "benchmarks" / "results" / "llm_peers.json").read_text())["selected"]
    rows = dry["compress"]
    assert [(r["budget"], r["shape"]) for r in rows] == [(b, s) for b in (0.2, 0.5) for s in ("llama-tiny", "llama-tiny-2x")]
    for r in rows:
        assert r["ok"], r.get("traceback")
        assert r["configuration"] == selected[str(r["budget"])]
        assert abs(r["share_removed"] - r["budget"]) < 0.02 and r["params_after"] < r["params"]
        assert r["weight_bytes"] == 4 * r["params"] and r["seconds"] > 0  # float32, tied embeddings counted once
        assert r["peak_bytes"] is None  # no CUDA: no peak quoted
    assert set(dry["compress_growth"]) == set(selected[str(b)] for b in (0.2, 0.5))


def test_table4_removes_half_the_heads(dry):
    bert = dry["models"]["bert-base"]
    assert bert["pruned"]["50% of heads"]["heads"] * 2 == bert["unpruned"]["heads"]


def test_without_cuda_and_without_dry_run_says_so_and_writes_nothing(tmp_path):
    out = tmp_path / "gpu_bench.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2 and "no CUDA device" in run.stderr and not out.exists()
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2 and "--out" in run.stderr
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--time-limit", "10",
                          "--compress-limit", "20"], env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "--compress-limit 20.0" in run.stderr and not out.exists()


def test_update_measures_what_the_flags_name_and_keeps_the_rest(dry, tmp_path):
    """A second run of one speed shape and one compress row with --update: those rows are the new run's, every
    other row is the first run's, and both runs are named."""
    out = tmp_path / "gpu_bench.json"
    out.write_text(json.dumps(dry))
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--shapes", "llama-tiny",
                          "--compress-shapes", "llama-tiny", "--compress-budgets", "0.2", "--update"], env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert [r["run"] for r in got["runs"]] == [1, 2] and "--update" in got["runs"][1]["command"]
    assert len(got["rows"]) == len(dry["rows"]) and {r["run"] for r in got["rows"]} == {2}
    assert [(r["batch"], r["run"]) for r in got["table4"]] == [(r["batch"], 1) for r in dry["table4"]]
    assert sorted((r["shape"], r["budget"], r["run"]) for r in got["compress"]) == sorted(
        (r["shape"], r["budget"], 2 if (r["shape"], r["budget"]) == ("llama-tiny", 0.2) else 1) for r in dry["compress"])


@pytest.mark.parametrize("flags, named", [(["--shapes", "llama-huge"], "--shapes"),
                                          (["--compress-shapes", "bert-base"], "--compress-shapes"),
                                          (["--compress-budgets", "0.4"], "--compress-budgets")])
def test_a_shape_or_budget_it_does_not_have_is_refused(tmp_path, flags, named):
    out = tmp_path / "gpu_bench.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *flags], env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and named in run.stderr and "allowed" in run.stderr and not out.exists()
