"""ONNX export of pruned models: onnxruntime against PyTorch on inputs the export never saw."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.export import ExportError, export_onnx
from tiny import build, inputs, word_tokenizer

PLANS = {
    "bert": {"encoder.0.self": [0, 2], "encoder.1.self": [3]},
    # GQA: uneven plan (key/value heads repeated) and an emptied site
    "llama": {"decoder.0.self": [0, 1, 4], "decoder.1.self": list(range(6))},
    "bart": {"encoder.0.self": [1], "encoder.1.self": [0, 3], "decoder.0.self": [2], "decoder.1.cross": [0, 1]},
}


@pytest.mark.parametrize("family", list(PLANS))
def test_onnxruntime_matches_pytorch_on_new_shapes(family, tmp_path):
    model = build(family)
    hp.prune_heads(model, PLANS[family])
    report = export_onnx(model, tmp_path / "onnx")
    assert report["check"]["relative"] <= 1e-4
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch, length in ((1, 5), (4, 19)):  # other shapes than the trace and the export's own check
        x = inputs(family, batch=batch, length=length, seed=7)
        feed = {i.name: x[i.name].numpy() for i in session.get_inputs()}
        got = session.run(None, feed)[0]
        with torch.no_grad():
            want = model(**x).logits.numpy()
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), (family, batch, length)


def test_export_refuses_a_graph_that_differs(tmp_path):
    model = build("bert")
    with pytest.raises(ExportError, match="differs from PyTorch"):
        export_onnx(model, tmp_path / "onnx", tolerance=1e-12)  # float32 cannot meet this
    assert not (tmp_path / "onnx").exists()


def test_cli_export_with_the_tokenizer(tmp_path):
    model = build("llama")
    hp.prune_heads(model, {"decoder.0.self": [0, 3]})
    tok = word_tokenizer(["the quick brown fox jumps over the lazy dog", "attention heads can be removed"])
    hp.save_pruned(model, tmp_path / "m", tokenizer=tok)
    r = CliRunner().invoke(app, ["export", str(tmp_path / "m"), "--format", "onnx", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "out" / "export.json").read_text())
    assert report["check"]["inputs"].startswith("English sentences, tokenized") and report["check"]["relative"] <= 1e-4
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    bad = CliRunner().invoke(app, ["export", str(tmp_path / "m"), "--format", "tflite", "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--format 'tflite'" in bad.output and not (tmp_path / "x").exists()


def test_cli_bench_times_the_onnx_models(tmp_path):
    hp.save_pruned(build("bert"), tmp_path / "bert")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["bench", str(tmp_path / "bert"), "--batch-sizes", "1,2", "--seq-len", "8",
                                 "--repeats", "2", "--warmup", "0", "--min-repeat-s", "0", "--no-memory",
                                 "--prune-fraction", "0.5", "--onnx", "-o", str(out)])
    assert r.exit_code == 0, r.output
    onnx = json.loads((out / "bench.json").read_text())["extra"]["onnx"]
    assert set(onnx["models"]) == {"bert", "bert-pruned0.5"} and set(onnx["models"]["bert"]) == {"1", "2"}
    for per in onnx["models"].values():
        for b, t in per.items():
            assert len(t["seconds"]) == 2 and t["examples_per_s"] == pytest.approx(int(b) / np.median(t["seconds"]))
    assert [(u["model"], u["reference"]) for u in onnx["speedups"]] == [("bert-pruned0.5", "bert")] * 2
    assert "onnxruntime" in r.output
