"""benchmarks/llamacpp_budgets.py: its byte and fallback accounting against gguf's own reader and the shapes in
the file, a layer with no FFN neurons exported exactly, and docs/llm_export.md's section equal to what the
committed JSON generates."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import headprune
from headprune.errors import ConfigError
from headprune.export.gguf import export_gguf, read_gguf_tensors
from headprune.export.gguf_files import bytes_per_weight, gguf_inventory, wider_than
from llm_tiny import TEXTS, bpe_tokenizer, tiny_decoder

gguf = pytest.importorskip("gguf")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "llamacpp_budgets.json"
HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


def _bench():
    spec = importlib.util.spec_from_file_location("llamacpp_budgets", ROOT / "benchmarks" / "llamacpp_budgets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read(path) -> dict[str, tuple[str, list[int]]]:
    """{name: (GGML type, shape [out, in])} with gguf's reader, not headprune's."""
    return {t.name: (t.tensor_type.name, [int(n) for n in reversed(t.shape.tolist())])
            for t in gguf.GGUFReader(str(path)).tensors}


def _data_bytes(tensors: dict) -> int:
    """Tensor bytes from the shapes and GGML block sizes alone."""
    total = 0
    for kind, shape in tensors.values():
        block, size = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, kind)]
        total += math.prod(shape) // block * size
    return total


@pytest.mark.parametrize("multiple", [32, 1])
def test_quick_run_counts_bytes_fallbacks_and_wider_tensors_as_the_files_hold_them(tmp_path, multiple):
    """multiple_of=32: no tensor falls back or is wider than the unpruned one; multiple_of=1 (any width): every
    tensor whose input width is off the 32-block is F16, and the wider ones are exactly those the unpruned model
    had on the block. Bytes, parameters and shares recomputed from gguf's reader."""
    out = _bench().main(["--quick", "--out", str(tmp_path / "q.json"), "--budgets", "0.3",
                         "--multiple", str(multiple)])
    assert json.loads((tmp_path / "q.json").read_text())["entries"].keys() == out["entries"].keys()
    run = tmp_path / "q_files"
    entry = out["entries"]["0.3/legacy"]
    base = {k: _read(run / "unpruned" / f"{k}.gguf") for k in entry["files"]}  # + Q4_K_M where llama.cpp is installed
    assert entry["multiple_of"] == multiple and entry["changed_widths_aligned"]
    offblock_seen = 0
    for kind, rec in entry["files"].items():
        path = run / rec["file"]
        mine = _read(path)
        assert rec["bytes"] == path.stat().st_size
        assert rec["tensor_bytes"] == _data_bytes(mine)
        assert rec["types"] == {t: sum(v[0] == t for v in mine.values()) for t in {v[0] for v in mine.values()}}
        params = sum(math.prod(s) for _, s in mine.values())
        assert rec["params"] == params
        assert rec["params_removed_share"] == pytest.approx(1 - params / sum(math.prod(s) for _, s in base[kind].values()))
        assert rec["bytes_ratio"] == pytest.approx(path.stat().st_size / (run / "unpruned" / f"{kind}.gguf").stat().st_size)
        if kind in ("Q8_0", "Q4_0"):
            offblock = {n for n, (_, s) in mine.items() if len(s) == 2 and s[1] % 32}
            assert {n for n, (t, _) in mine.items() if t == "F16"} == offblock == set(rec["exporter"]["fallback_f16"])
            was_on_block = {n for n in offblock if base[kind][n][1][1] % 32 == 0}
            assert set(rec["wider_than_unpruned"]) == was_on_block == set(rec["exporter"]["wider_than_unpruned"])
            offblock_seen += len(offblock)
            assert rec["meets_size_goal"] == (rec["bytes_removed_share"] >= 0.9 * rec["params_removed_share"])
    if multiple == 32:
        assert offblock_seen == 0 and out["summary"]["with_wider_tensors"] == []
    else:  # the unaligned plan leaves widths off the block: the accounting must see them
        assert offblock_seen > 0 and out["summary"]["with_wider_tensors"]


def test_inventory_and_wider_than_read_the_file(tmp_path):
    model, tok = tiny_decoder("llama"), bpe_tokenizer()
    export_gguf(model, tmp_path / "u.gguf", tokenizer=tok, outtype="q8_0", reload=False)
    headprune.prune_neurons(model, {headprune.find_ffns(model)[0].name: list(range(28))})  # 128 -> 100: off-block
    export_gguf(model, tmp_path / "p.gguf", tokenizer=tok, outtype="q8_0", reload=False)
    inv, ref = gguf_inventory(tmp_path / "p.gguf"), gguf_inventory(tmp_path / "u.gguf")
    assert inv["bytes"] == (tmp_path / "p.gguf").stat().st_size and inv["tensor_bytes"] == _data_bytes(_read(tmp_path / "p.gguf"))
    assert inv["meta"]["feed_forward_length"] == [100, 128, 128] and inv["meta"]["head_count"] == [4, 4, 4]
    assert wider_than(inv, ref) == ["blk.0.ffn_down.weight"] and wider_than(ref, ref) == []
    assert bytes_per_weight("Q8_0") == 34 / 32 and bytes_per_weight("F16") == 2


def _ppl(model, ids) -> float:
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    return math.exp(float(torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:])))


def test_a_layer_with_no_ffn_neurons_is_written_as_zeros_and_computes_the_same(tmp_path):
    """deci would skip a width-0 layer whole; zero weights of ZERO_FFN neurons add exactly nothing (plus the down
    bias compensation added). The exporter's own checks (tensors, logits) pass, and llama.cpp agrees where it is
    installed."""
    from headprune.export.gguf_layout import ZERO_FFN

    model, tok = tiny_decoder("llama", layers=3), bpe_tokenizer()
    ffn = headprune.find_ffns(model)[1]
    headprune.prune_neurons(model, {ffn.name: list(range(128))})
    model.model.layers[1].mlp.down_proj.bias = torch.nn.Parameter(torch.randn(64) * 0.1)
    report = export_gguf(model, tmp_path / "z.gguf", tokenizer=tok, reload=False)
    arrays, _, meta = read_gguf_tensors(tmp_path / "z.gguf")
    assert report["zero_ffn_layers"] == [1] and report["feed_forward_length"] == [128, ZERO_FFN, 128]
    assert meta["deci.feed_forward_length"] == [128, ZERO_FFN, 128]
    for part in ("gate", "up", "down"):
        assert not np.any(arrays[f"blk.1.ffn_{part}.weight"])
    np.testing.assert_array_equal(arrays["blk.1.ffn_down.bias"], model.model.layers[1].mlp.down_proj.bias.detach().numpy())
    assert report["check"]["logits_relative"] <= 1e-4
    small = export_gguf(model, tmp_path / "z32.gguf", tokenizer=tok, outtype="q8_0", reload=False, zero_ffn=32)
    assert small["feed_forward_length"] == [128, 32, 128] and small["fallback_f16"] == []
    with pytest.raises(ConfigError, match="zero_ffn"):
        export_gguf(model, tmp_path / "bad.gguf", tokenizer=tok, zero_ffn=0)
    if HAS_LLAMA_CPP:
        from headprune.export.llamacpp import llama_logits

        ids = tok(" ".join(TEXTS), return_tensors="pt")["input_ids"]
        with torch.no_grad():
            want = model(input_ids=ids).logits[0].float()
        got = torch.from_numpy(llama_logits(tmp_path / "z.gguf", ids[0].tolist()))
        assert float((got - want).abs().max() / want.abs().max()) <= 1e-4


def test_bad_flags_are_refused_with_the_flag_named(tmp_path):
    bench = _bench()
    for argv, flag in ((["--budgets", "0.3,1.5"], "--budgets"), (["--speed-types", "Q5_K"], "--speed-types"),
                       (["--rounds", "0"], "--rounds"), (["--quick"], "--quick")):
        with pytest.raises(SystemExit) as e:
            bench.parse(argv)
        assert flag in str(e.value)


@pytest.mark.skipif(not RESULTS.is_file(), reason="benchmarks/results/llamacpp_budgets.json not committed yet")
def test_the_committed_docs_section_is_what_the_committed_results_generate(tmp_path):
    bench = _bench()
    committed = (ROOT / "docs" / "llm_export.md").read_text(encoding="utf-8")
    page = tmp_path / "llm_export.md"
    page.write_text(committed, encoding="utf-8")
    bench.main(["--write-docs", str(page)])
    assert page.read_text(encoding="utf-8") == committed, \
        "run: python benchmarks/llamacpp_budgets.py --write-docs docs/llm_export.md"
    out = json.loads(RESULTS.read_text())
    assert out["settings"]["quick"] is False and out["settings"]["config"] == "headprune-fisher+linear"
    assert "unpruned" in out["entries"] and set(out["entries"]) <= {
        "unpruned", *(f"{b}/{p}" for b in (0.1, 0.2, 0.3, 0.5) for p in ("legacy", "kquant"))}
    for key, entry in out["entries"].items():  # the committed accounting agrees with itself
        for kind, f in entry["files"].items():
            base = out["entries"]["unpruned"]["files"][kind]
            assert f["bytes"] > f["tensor_bytes"] > 0
            if key != "unpruned":
                assert f["bytes_ratio"] == pytest.approx(f["bytes"] / base["bytes"])
                assert f["params_removed_share"] == pytest.approx(1 - f["params"] / base["params"])
                if f["judged"]:
                    assert f["meets_size_goal"] == (1 - f["bytes_ratio"] >= 0.9 * f["params_removed_share"])
