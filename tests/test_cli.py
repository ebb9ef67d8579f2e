"""The CLI is a thin layer: it lists sites, prunes, runs the quick demo, and refuses bad input cleanly."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from tiny import build, inputs

runner = CliRunner()


@pytest.fixture
def bert_dir(tmp_path):
    model = build("bert")
    hp.save_pruned(model, tmp_path / "bert")
    return tmp_path / "bert"


def test_sites_table_and_json(bert_dir):
    result = runner.invoke(app, ["sites", str(bert_dir)])
    assert result.exit_code == 0, result.output
    assert "encoder.0.self" in result.output and "encoder.1.self" in result.output
    assert "2 sites, 8 heads" in result.output
    result = runner.invoke(app, ["sites", str(bert_dir), "--json"])
    data = json.loads(result.stdout)
    assert [s["name"] for s in data["sites"]] == ["encoder.0.self", "encoder.1.self"]
    assert data["sites"][0] == {"name": "encoder.0.self", "kind": "encoder", "layer": 0, "heads": 4, "kv_heads": 4,
                                "head_dim": 8, "params": 4 * (32 * 32 + 32),
                                "module": "bert.encoder.layer.0.attention.self"}


def test_prune_writes_a_loadable_smaller_model(bert_dir, tmp_path):
    out = tmp_path / "pruned"
    result = runner.invoke(app, ["prune", str(bert_dir), "--drop", '{"encoder.1.self": [0, 2]}', "-o", str(out)])
    assert result.exit_code == 0, result.output
    pruned = hp.load_pruned(out)
    reference = hp.load_pruned(bert_dir)
    x = inputs("bert")
    with torch.no_grad(), hp.masked(reference, hp.mask_from_heads(reference, {"encoder.1.self": [0, 2]})):
        want = reference(**x).logits
    with torch.no_grad():
        assert (pruned(**x).logits - want).abs().max().item() <= 1e-5
    assert hp.kept_heads(pruned)["encoder.1.self"] == [1, 3]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--drop", '{"encoder.5.self": [0]}'], "unknown site 'encoder.5.self'"),
        (["--drop", '{"encoder.0.self": [9]}'], "head index 9 out of range"),
        (["--drop", "{not json"], "--drop: not valid JSON"),
        (["--drop", "[1, 2]"], "expected a JSON object"),
        (["--heads", "{not json"], "No such option: --heads"),  # the former name, removed in 0.3.0
        ([], "give the heads to remove with --drop"),
    ],
)
def test_prune_bad_input_one_line_nonzero_nothing_written(bert_dir, tmp_path, args, message):
    out = tmp_path / "never"
    result = runner.invoke(app, ["prune", str(bert_dir), *args, "-o", str(out)])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_missing_model_dir_and_existing_output(bert_dir, tmp_path):
    result = runner.invoke(app, ["sites", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = runner.invoke(app, ["prune", str(bert_dir), "--drop", "{}", "-o", str(bert_dir)])
    assert result.exit_code == 2 and "already exists" in result.output


def test_quick_demo_writes_results_and_a_pruned_model(tmp_path):
    result = runner.invoke(app, ["demo", "--quick", "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    printed = re.findall(r"^\[(\d+)/(\d+)\]", result.output, flags=re.M)  # the steps the demo says it takes ...
    assert printed == [(str(i), "11") for i in range(1, 12)]  # both acts
    shown = " ".join(runner.invoke(app, ["demo", "--help"], terminal_width=400).output.split())
    assert all(f"[{i}/11]" in shown for i in range(1, 12))  # ... are the steps its --help describes
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["perplexity"]["masked"] == pytest.approx(results["perplexity"]["pruned"], rel=1e-5)
    assert results["parameters"]["after"] < results["parameters"]["before"]
    assert set(results["signature"]) >= {"model", "data", "split", "n", "method", "seed", "versions"}
    model = hp.load_pruned(tmp_path / "run" / "pruned_model")
    n_dropped = sum(len(v) for v in results["pruned_heads"].values())
    assert sum(s.num_heads for s in hp.find_sites(model)) == 18 - n_dropped
    again = runner.invoke(app, ["demo", "--quick", "-o", str(tmp_path / "run")])  # a rerun resumes, same numbers
    assert again.exit_code == 0, again.output
    rerun = json.loads((tmp_path / "run" / "results.json").read_text())
    assert rerun["perplexity"] == results["perplexity"] and rerun["pruned_heads"] == results["pruned_heads"]
    # the demo's GQA Llama never gets a larger KV cache: no site caches more key/value heads than its 2
    assert all(s.k.width <= 2 * s.head_dim for s in hp.find_sites(model))
    assert results["kv_cache_bytes_per_token"]["after"] <= results["kv_cache_bytes_per_token"]["before"]
    check_act_two(results, result.output, tmp_path / "run")


def check_act_two(results: dict, output: str, run) -> None:
    """Act two of the quick demo: 20% (and 10%) of the non-embedding parameters removed by headprune and FLAP,
    ratios to the unpruned perplexity, the recovery, the summary table printed and stored, the figure."""
    second = results["act_two"]
    model = hp.load_pruned(run / "pruned_model")  # act one's; the unpruned count is recomputed by hand below
    total = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel() - (
        0 if model.config.tie_word_embeddings else model.get_output_embeddings().weight.numel())
    assert total < second["unpruned"]["nonembedding_params"]  # act one removed heads; act two starts unpruned
    assert second["unpruned"]["perplexity"] == pytest.approx(results["perplexity"]["unpruned"], rel=1e-6)
    assert [(r["method"], r["budget"]) for r in second["rows"]] == [
        ("headprune-fisher+linear", 0.1), ("flap", 0.1), ("headprune-fisher+linear", 0.2), ("flap", 0.2)]
    for r in second["rows"]:
        assert r["removed_share"] == pytest.approx(r["budget"], abs=0.02)  # within a few units of the tiny model
        assert r["ratio"]["ratio"] == pytest.approx(r["perplexity"] / second["unpruned"]["perplexity"], rel=1e-9)
        assert r["ratio"]["ci_low"] <= r["ratio"]["ratio"] <= r["ratio"]["ci_high"]
    assert second["recovered"]["tokens"] == 1024 and second["recovered"]["steps"] == 1024 // (2 * 128)
    header, *rows = second["summary"]
    assert header[2] == "held-out perplexity" and [r[0].split(" (")[0].strip() for r in rows] == [
        "unpruned", "headprune", "+ recovery", "FLAP"]
    assert rows[1][2] == f"{second['headprune']['perplexity']:.2f}" and rows[3][2] == f"{second['flap']['perplexity']:.2f}"
    assert all(" ".join(r[:1]) in output for r in second["summary"])  # printed at the end
    report = (run / "report.html").read_text()
    assert (run / "act_two.png").stat().st_size > 0 and "Act two: held-out perplexity against" in report
    assert f"<td>{rows[3][0]}</td>" in report  # the summary table in the report too


def test_python_dash_m_is_the_same_app(bert_dir):
    out = subprocess.run([sys.executable, "-m", "headprune", "sites", str(bert_dir), "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["class"] == "BertForSequenceClassification"


def test_sites_and_prune_take_device_and_dtype(bert_dir, tmp_path):
    result = runner.invoke(app, ["sites", str(bert_dir), "--device", "tpu"])
    assert result.exit_code == 2 and "--device 'tpu'" in result.output
    out = tmp_path / "bf16"
    result = runner.invoke(app, ["prune", str(bert_dir), "--drop", '{"encoder.0.self": [1]}', "--dtype", "bfloat16",
                                 "--device", "cpu", "-o", str(out)])
    assert result.exit_code == 0, result.output
    from safetensors import safe_open

    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:  # the weights as written to disk
        dtypes = {f.get_tensor(k).dtype for k in f.keys() if f.get_tensor(k).is_floating_point()}
    assert dtypes == {torch.bfloat16}
    result = runner.invoke(app, ["prune", str(bert_dir), "--drop", "{}", "--dtype", "float64", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--dtype 'float64'" in result.output and not (tmp_path / "x").exists()
