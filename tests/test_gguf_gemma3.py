"""Gemma-3 (``gemma3_text``) as llama.cpp's ``gemma3`` GGUF: a tiny random Gemma3ForCausalLM -- sliding layers
interleaved with full ones, a window shorter than the test text, two rope bases, head_dim 24 != hidden / heads,
grouped-query attention, random norms -- unpruned and pruned unevenly (different query / key-value heads and FFN
widths per layer, a layer with no neurons, a layer with no heads), its file read back by the ``gguf`` package and
run by llama.cpp itself (``llama-cpp-python``), whose logits must match PyTorch's."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
import transformers

import headprune
from headprune.export.gguf import export_gguf, read_gguf_tensors
from headprune.export.gguf_layout import GGUFShapeError, gguf_layout
from llm_tiny import TEXTS, bpe_tokenizer

pytest.importorskip("gguf")
needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                     reason="llama-cpp-python not installed (pip install 'headprune[llamacpp]')")
# llama.cpp vs PyTorch float32 logits, max difference / largest |logit|: llama.cpp's GELU reads a float16 table
# (ggml's GGML_GELU_FP16), through 4 layers with q/k and post norms: 5e-4 to 7e-4 measured here (2e-4 with that
# table emulated in PyTorch); a file without the window, or with another attention scale, is off by 0.1 and more
GEMMA3_TOLERANCE = 2e-3
Q8_PPL_RATIO = 1.02  # llama.cpp Q8_0 perplexity / PyTorch float32 perplexity, at most
HEAD_DIM, WINDOW = 24, 8


def tiny_gemma3(*, layers: int = 4, query_pre_attn_scalar: int = HEAD_DIM, seed: int = 0, **extra):
    """A random Gemma3ForCausalLM: hidden 64, 4 query heads over 2 key/value heads of 24, FFN 128, layers sliding
    (window 8, rope base 100) and full (rope base 10000) in turn, random norm weights (Gemma's are zeros at init)."""
    torch.manual_seed(seed)
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}
    config = transformers.Gemma3TextConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=256, rms_norm_eps=1e-6,
        sliding_window=WINDOW, query_pre_attn_scalar=query_pre_attn_scalar, rope_parameters=extra.pop("rope", rope),
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)], **extra)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.mul_(4.0)  # larger than init, so that logits differ clearly between tokens
            elif "norm" in name:
                p.normal_(0.0, 0.3)
    return model


def prune_gemma3_unevenly(model) -> None:
    """Per layer: 2/2 heads (one per group), 2/1 (a whole group), 4/2 kept, 2/2; FFN widths 96, 128, 64, 0."""
    sites = [s.name for s in headprune.find_sites(model)]
    ffns = [f.name for f in headprune.find_ffns(model)]
    headprune.prune_heads(model, {sites[0]: [0, 2], sites[1]: [0, 1], sites[3]: [1, 3]})
    headprune.prune_neurons(model, {ffns[0]: list(range(32)), ffns[2]: list(range(0, 128, 2)),
                                    ffns[3]: list(range(128))})


def _ids(tokenizer) -> torch.Tensor:
    ids = tokenizer(" ".join(TEXTS), return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 4 * WINDOW  # the window matters
    return ids


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits[0].float()


def _rel(a, b) -> float:
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max() / torch.as_tensor(b).abs().max())


def _w(module) -> np.ndarray:
    return module.weight.detach().numpy()


def test_uneven_gemma3_written_padded_with_its_norms_and_windows(tmp_path):
    model = tiny_gemma3()
    prune_gemma3_unevenly(model)
    report = export_gguf(model, tmp_path / "g.gguf", tokenizer=bpe_tokenizer())
    arrays, types, meta = read_gguf_tensors(tmp_path / "g.gguf")
    assert report["arch"] == "gemma3" and set(types.values()) == {"F32"}
    assert report["kept"] == {"head_count": [2, 2, 4, 2], "head_count_kv": [2, 1, 2, 2],
                              "feed_forward_length": [96, 128, 64, 0]}
    assert (meta["gemma3.attention.head_count"], meta["gemma3.attention.head_count_kv"],
            meta["gemma3.feed_forward_length"]) == (4, 2, 128)  # llama.cpp's gemma3 reads one shape
    assert meta["gemma3.attention.sliding_window"] == WINDOW
    assert meta["gemma3.attention.sliding_window_pattern"] == [True, False, True, False]
    assert (meta["gemma3.rope.freq_base"], meta["gemma3.rope.freq_base_swa"]) == (10000.0, 100.0)
    layers = model.model.layers
    attn1 = layers[1].self_attn  # 2 query heads over 1 key/value head: slots 0 and 1 of group 0, group 1 zeros
    np.testing.assert_array_equal(arrays["blk.1.attn_k.weight"][:HEAD_DIM], _w(attn1.k_proj))
    np.testing.assert_array_equal(arrays["blk.1.attn_q.weight"][:2 * HEAD_DIM], _w(attn1.q_proj))
    np.testing.assert_array_equal(arrays["blk.1.attn_output.weight"][:, :2 * HEAD_DIM], _w(attn1.o_proj))
    for name in ("attn_k", "attn_v", "attn_q"):
        assert not arrays[f"blk.1.{name}.weight"][(2 if name == "attn_q" else 1) * HEAD_DIM:].any()
    assert not arrays["blk.1.attn_output.weight"][:, 2 * HEAD_DIM:].any()
    q0 = arrays["blk.0.attn_q.weight"]  # 2 over 2 (group 1): one query head in the first slot of each group of 2
    np.testing.assert_array_equal(q0[:HEAD_DIM], _w(layers[0].self_attn.q_proj)[:HEAD_DIM])
    np.testing.assert_array_equal(q0[2 * HEAD_DIM:3 * HEAD_DIM], _w(layers[0].self_attn.q_proj)[HEAD_DIM:])
    assert not q0[HEAD_DIM:2 * HEAD_DIM].any() and not q0[3 * HEAD_DIM:].any()
    np.testing.assert_array_equal(arrays["blk.0.ffn_down.weight"][:, :96], _w(layers[0].mlp.down_proj))
    assert not arrays["blk.0.ffn_down.weight"][:, 96:].any() and not arrays["blk.3.ffn_gate.weight"].any()
    for gguf_name, module in (("attn_norm", "input_layernorm"), ("post_attention_norm", "post_attention_layernorm"),
                              ("ffn_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm"),
                              ("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm")):
        want = 1 + _w(layers[2].get_submodule(module))
        np.testing.assert_allclose(arrays[f"blk.2.{gguf_name}.weight"], want, rtol=0, atol=1e-7)
    assert "output.weight" not in arrays  # tied: llama.cpp reads token_embd
    assert report["check"]["logits_relative"] <= 1e-6  # the file's weights, padding dropped, compute the model


@pytest.mark.parametrize("layers, scalar, base", [(4, 16, HEAD_DIM), (4, HEAD_DIM, HEAD_DIM), (62, HEAD_DIM, 16)])
def test_query_scale_folded_into_the_query_norm(layers, scalar, base):
    """llama.cpp scales scores by 1 / sqrt(head_dim), at 62 layers by 1 / sqrt(hidden // heads) (64 // 4 = 16): the
    config's 1 / sqrt(query_pre_attn_scalar) over it multiplies the query norm's 1 + w."""
    model = tiny_gemma3(layers=layers, query_pre_attn_scalar=scalar)
    layout = gguf_layout(model)
    want = (1 + _w(model.model.layers[1].self_attn.q_norm)) * math.sqrt(base / scalar)
    np.testing.assert_allclose(layout.tensors["blk.1.attn_q_norm.weight"], want, rtol=1e-6)
    assert layout.scaled == ({} if base == scalar else {f"blk.{i}.attn_q_norm.weight": math.sqrt(base / scalar)
                                                        for i in range(layers)})
    k = layout.tensors["blk.1.attn_k_norm.weight"]
    np.testing.assert_allclose(k, 1 + _w(model.model.layers[1].self_attn.k_norm), rtol=0, atol=1e-7)


def _emptied(model) -> None:
    """Layer 1 loses every head, layer 2 every neuron, layer 3 one head per group."""
    sites = [s.name for s in headprune.find_sites(model)]
    headprune.prune_heads(model, {sites[1]: [0, 1, 2, 3], sites[3]: [0, 2]})
    headprune.prune_neurons(model, {headprune.find_ffns(model)[2].name: list(range(128))})


@needs_llama_cpp
@pytest.mark.parametrize("case", ["unpruned", "uneven", "emptied", "query_scale", "62_layers"])
def test_llama_cpp_logits_match_pytorch(tmp_path, case):
    """The acceptance check: llama.cpp runs the exported file and its logits match PyTorch's within
    GEMMA3_TOLERANCE of the largest; unpruned, pruned unevenly (padded), with a layer that lost every head and one
    that lost every neuron, with query_pre_attn_scalar != head_dim, and at 62 layers (llama.cpp's other scale)."""
    from headprune.export.llamacpp import llama_logits

    layers, scalar = (62, HEAD_DIM) if case == "62_layers" else (4, 16 if case == "query_scale" else HEAD_DIM)
    model, tok = tiny_gemma3(layers=layers, query_pre_attn_scalar=scalar), bpe_tokenizer()
    if case == "uneven":
        prune_gemma3_unevenly(model)
    elif case == "emptied":
        _emptied(model)
    ids = _ids(tok)
    want = _logits(model, ids)
    report = export_gguf(model, tmp_path / "f32.gguf", tokenizer=tok)
    assert report["arch"] == "gemma3"
    got = torch.from_numpy(llama_logits(tmp_path / "f32.gguf", ids[0].tolist()))
    assert _rel(got, want) <= GEMMA3_TOLERANCE
    if case == "unpruned":  # the window matters on this text: without it PyTorch computes far from llama.cpp
        model.config.sliding_window = 10 ** 6
        assert _rel(got, _logits(model, ids)) > 50 * GEMMA3_TOLERANCE
    if case == "uneven":  # and quantised: Q8_0's perplexity close to PyTorch's float32 one
        export_gguf(model, tmp_path / "q8.gguf", tokenizer=tok, outtype="q8_0")
        q8 = torch.from_numpy(llama_logits(tmp_path / "q8.gguf", ids[0].tolist()))
        ppl = [math.exp(float(torch.nn.functional.cross_entropy(x[:-1].double(), ids[0, 1:]))) for x in (q8, want)]
        assert 0 < _rel(q8, want) and ppl[0] / ppl[1] <= Q8_PPL_RATIO


def _compensated(model) -> None:
    from headprune.core.cut.biases import shift_biases

    sites = [s.name for s in headprune.find_sites(model)]
    shift_biases(model, {sites[0]: 0.1 * torch.ones(model.config.hidden_size)})


LINEAR = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
          "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}


@pytest.mark.parametrize("case, match", [
    ("final_logit_softcapping", "final_logit_softcapping=30.0"), ("attn_logit_softcapping", "attn_logit_softcapping"),
    ("use_bidirectional_attention", "use_bidirectional_attention"), ("rope", "rope scaling 'linear'"),
    ("biased", "bias"), ("repeat_kv", "repeats key/value heads")])
def test_refused_before_anything_is_written(tmp_path, case, match):
    """What llama.cpp's gemma3 would compute differently: logit softcapping and bidirectional attention (it applies
    neither), rope scaling, output-projection biases (bias compensation: its gemma3 reads none), query heads
    pruned unevenly across key/value groups (key/value heads repeated at run time)."""
    extra = {"rope": LINEAR} if case == "rope" else {case: 30.0 if "softcapping" in case else True}
    model = tiny_gemma3(**(extra if case not in ("biased", "repeat_kv") else {}))
    if case == "biased":
        _compensated(model)
    elif case == "repeat_kv":
        headprune.prune_heads(model, {headprune.find_sites(model)[0].name: [0]})
    with pytest.raises(GGUFShapeError, match=match):
        export_gguf(model, tmp_path / "x.gguf", tokenizer=bpe_tokenizer())
    assert list(tmp_path.iterdir()) == []
