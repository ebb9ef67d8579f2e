"""benchmarks/compress_memory.py --quick: the row it writes, checked against the quick model counted here, and
compress's output head never producing a batch's ``[B, T, V]`` logits at once (issue #47 item 4)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from headprune.core.model import chunked

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("compress_memory", ROOT / "benchmarks" / "compress_memory.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
llm_peers = sys.modules["llm_peers"]

CHUNK = 5  # token rows per chunk in this test


def test_quick_run_records_peak_weights_and_ratio_and_never_makes_full_logits(tmp_path, monkeypatch):
    made, rows = [], []

    def quick_model():
        model, tok = original()
        made.append(sum(p.numel() for p in model.parameters()))
        vocab = model.get_output_embeddings().weight.shape[0]
        model.get_output_embeddings().register_forward_hook(lambda m, a, out: rows.append(tuple(out.shape[:-1])))
        monkeypatch.setattr(chunked, "LOGIT_BYTES", 4 * vocab * CHUNK)
        return model, tok

    original = llm_peers.quick_model
    monkeypatch.setattr(llm_peers, "quick_model", quick_model)
    out_file = tmp_path / "memory.json"
    out = bench.main(["--quick", "--output", str(out_file)])
    assert json.loads(out_file.read_text()) == out
    (row,) = out["rows"]
    assert row["configuration"] == "headprune-fisher+linear" and row["budget"] == 0.2
    assert row["weights_float32_bytes"] == 4 * made[0]
    assert row["peak_rss_delta_bytes"] is None or row["peak_rss_delta_bytes"] > 0
    if row["peak_rss_delta_bytes"] is not None:
        assert row["peak_over_weights"] == pytest.approx(row["peak_rss_delta_bytes"] / row["weights_float32_bytes"])
    b, t, v = row["batch_size"], row["calib_block"], row["vocab"]
    assert row["full_logits_bytes"] == 4 * b * t * v
    assert row["params_after"] < made[0]
    # what the head produced: chunks, the probe positions of a batch, or one example's logits (the first batch's
    # check of the model's own loss, the FLOP count's one example); never a batch's [B, T, V]
    assert (CHUNK,) in rows
    small = max(CHUNK, b * chunked.PROBE_TOKENS)
    assert all(len(r) == 1 and r[0] <= small or len(r) == 2 and (r[0] == 1 or r[0] * r[1] <= small) for r in rows), rows
    assert (b, t) not in rows
    again = bench.main(["--quick", "--output", str(out_file)])  # a second run replaces the model's row
    assert len(again["rows"]) == 1


def test_model_or_quick_is_required():
    with pytest.raises(SystemExit):
        bench.parse([])
    with pytest.raises(SystemExit):
        bench.parse(["--quick", "--model", "x.gguf"])
