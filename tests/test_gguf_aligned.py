"""GGUF bytes follow parameters when pruned widths are aligned: the export report counts tensors written in a
wider type than the unpruned model's same tensor (an FFN width off the quantisation block falls back to F16),
and a model compressed with ``multiple_of=32`` has none, its tensor bytes shrinking with its parameters."""

from __future__ import annotations

import pytest

import headprune as hp
from headprune.export.gguf import export_gguf
from llm_tiny import TEXTS, bpe_tokenizer, tiny_decoder

gguf = pytest.importorskip("gguf")


def _tensors(path) -> dict[str, tuple[str, int, int]]:
    """{name: (GGML type, elements, bytes)} read with gguf's own reader (not headprune's)."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, int(t.n_elements), int(t.n_bytes)) for t in reader.tensors}


def test_an_unaligned_ffn_width_is_reported_wider(tmp_path):
    model, tok = tiny_decoder("llama"), bpe_tokenizer()  # FFN 128: Q8_0 blocks of 32 fit
    ffn = hp.find_ffns(model)[0]
    hp.prune_neurons(model, {ffn.name: list(range(28))})  # 128 -> 100, not a multiple of 32
    report = export_gguf(model, tmp_path / "p.gguf", tokenizer=tok, outtype="q8_0", reload=False)
    types = _tensors(tmp_path / "p.gguf")
    assert types["blk.0.ffn_down.weight"][0] == "F16" and types["blk.1.ffn_down.weight"][0] == "Q8_0"
    assert report["wider_than_unpruned"] == ["blk.0.ffn_down.weight"]
    assert "blk.0.ffn_down.weight" in report["fallback_f16"]


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0"])
def test_aligned_compression_has_no_wider_tensor_and_bytes_follow_parameters(outtype, tmp_path):
    tok = bpe_tokenizer()
    unpruned = tiny_decoder("llama")
    ids = tok(" ".join(TEXTS), return_tensors="pt")["input_ids"][:, :32]
    batches = [{"input_ids": ids, "labels": ids.clone()}] * 2
    settings = hp.PruneSettings(units="both", share=0.6, price="params", compensate="none", multiple_of=32)
    pruned = hp.compress(unpruned, batches, settings).model
    assert any(f.width != 128 for f in hp.find_ffns(pruned))
    export_gguf(unpruned, tmp_path / "u.gguf", tokenizer=tok, outtype=outtype, reload=False)
    report = export_gguf(pruned, tmp_path / "p.gguf", tokenizer=tok, outtype=outtype, reload=False)
    assert report["wider_than_unpruned"] == [] and report["fallback_f16"] == []
    before, after = _tensors(tmp_path / "u.gguf"), _tensors(tmp_path / "p.gguf")
    for name, (kind, _, _) in after.items():
        assert kind == before[name][0], name  # no tensor in a wider (or other) type than unpruned
    removed_params = 1 - sum(e for _, e, _ in after.values()) / sum(e for _, e, _ in before.values())
    removed_bytes = 1 - sum(b for _, _, b in after.values()) / sum(b for _, _, b in before.values())
    assert removed_params > 0.05 and removed_bytes >= 0.9 * removed_params
