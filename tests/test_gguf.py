"""Models where users keep them: every CLI command takes a GGUF file through transformers' GGUF reader."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import transformers
from typer.testing import CliRunner

import headprune as hp
from gguf_writer import write_llama_gguf
from headprune.cli import app
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


def test_load_model_holds_the_tensors_transformers_reads_bit_for_bit(tiny_gguf):
    """load_gguf rebuilds the model on the meta device and takes transformers' tensors: every parameter and buffer
    (non-persistent ones too) equals transformers' own GGUF load bit for bit, ties kept, nothing left on meta."""
    _, file = tiny_gguf
    loaded = hp.load_model(file)
    ref = transformers.AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32,
                                                            local_files_only=True)

    def every(m):
        return {**dict(m.named_parameters(remove_duplicate=False)), **dict(m.named_buffers(remove_duplicate=False))}

    got, want = every(loaded), every(ref)
    assert got.keys() == want.keys() and len(want) > 10
    for name, t in want.items():
        assert not got[name].is_meta and got[name].dtype == t.dtype and torch.equal(got[name], t), name
    assert [n for n, _ in loaded.named_parameters()] == [n for n, _ in ref.named_parameters()]  # the same ties


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
