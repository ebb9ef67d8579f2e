"""save_pruned -> load_pruned through transformers' own loading: every family that saves comes back equal
(renamed checkpoint keys, tied weights, emptied sites), with its attention implementation and dtype; bad
directories give one typed line; a failed save leaves nothing; plain from_pretrained refuses a pruned
directory loudly, naming headprune.load_pruned."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers as T
from safetensors import safe_open
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from tiny import build, inputs

C = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
RENAMED = {  # families whose checkpoint keys transformers 5 renames on save and back on load
    "mixtral": lambda: T.MixtralForCausalLM(T.MixtralConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
        num_local_experts=3, num_experts_per_tok=2, max_position_embeddings=64, **C)),
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
        **C)),
    "vit": lambda: T.ViTForImageClassification(T.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=16, patch_size=4,
        num_labels=3)),
}
PLANS = {  # every plan empties a whole site
    "bert": {"encoder.0.self": [0, 1, 2, 3], "encoder.1.self": [1]},
    "gpt2": {"decoder.0.self": [0, 1, 2, 3], "decoder.1.self": [0, 3]},
    "llama": {"decoder.0.self": [0, 3, 4], "decoder.1.self": [0, 1, 2, 3, 4, 5]},  # kv heads keep 2 and 1: uneven
    "bart": {"decoder.0.self": [0, 1, 2, 3], "encoder.1.self": [2], "decoder.1.cross": [1, 3]},
    "t5": {"encoder.0.self": [0, 1, 2, 3], "decoder.0.cross": [0, 1, 2, 3], "decoder.1.self": [1]},
    "mixtral": {"decoder.0.self": [1], "decoder.1.self": [0, 1, 2, 3]},  # kv heads keep 1 and 2: uneven
    "gpt_neox": {"decoder.0.self": [1, 2], "decoder.1.self": [0, 1, 2, 3]},
    "vit": {"encoder.0.self": [0, 1, 2, 3], "encoder.1.self": [2]},
}


def _model(family: str, attn: str = "eager"):
    if family not in RENAMED:
        return build(family, attn=attn)
    torch.manual_seed(0)
    model = RENAMED[family]()
    model.set_attn_implementation(attn)
    return model.eval()


def _inputs(family: str) -> dict:
    if family == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))}
    return inputs(family)


def _logits(model, x):
    with torch.no_grad():
        return model(**x).logits


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-6) -> bool:
    return (got.float() - want.float()).abs().max().item() <= rtol * max(want.float().abs().max().item(), 1e-12)


def _pruned(family: str, tmp_path, attn: str = "eager"):
    model = _model(family, attn)
    hp.prune_heads(model, PLANS[family], verify=False)
    path = hp.save_pruned(model, tmp_path / family)
    return model, path


# ---------------------------------------------------------------- 1. equal after reload, every family


@pytest.mark.parametrize("family", list(PLANS))
def test_reload_equals_the_saved_model(family, tmp_path):
    model, path = _pruned(family, tmp_path)
    loaded = hp.load_pruned(path)
    assert type(loaded) is type(model) and not loaded.training
    assert hp.kept_heads(loaded) == hp.kept_heads(model)
    assert any(not keep for keep in hp.kept_heads(loaded).values())  # a whole site is gone
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    buffers = dict(loaded.named_buffers())  # non-persistent ones too (RepeatHeads' index, rotary tables)
    assert all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())
    x = _inputs(family)
    assert _close(_logits(loaded, x), _logits(model, x))


@pytest.mark.parametrize("family", list(RENAMED))
def test_renamed_families_really_store_other_keys(family, tmp_path):
    """The premise of the test above: the checkpoint's keys are not the model's (a raw state-dict load fails)."""
    model, path = _pruned(family, tmp_path)
    with safe_open(path / "pruned.safetensors", "pt") as handle:
        stored = set(handle.keys())
    assert stored != set(model.state_dict())


def test_tied_weights_stay_tied_and_a_class_override_loads_the_base_model(tmp_path):
    model, path = _pruned("t5", tmp_path)
    loaded = hp.load_pruned(path)
    assert loaded.lm_head.weight.data_ptr() == loaded.shared.weight.data_ptr()
    model, path = _pruned("bert", tmp_path / "b")
    base = hp.load_pruned(path, model_class=T.BertModel)
    assert type(base) is T.BertModel
    x = inputs("bert")
    with torch.no_grad():
        want, got = model.bert(**x).last_hidden_state, base(**x).last_hidden_state
    assert _close(got, want)


# ---------------------------------------------------------------- 2. attention implementation, dtype, device


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("prune", [True, False])
def test_attention_implementation_is_kept_and_can_be_overridden(attn, prune, tmp_path):
    model = _model("llama", attn)
    if prune:
        hp.prune_heads(model, PLANS["llama"], verify=False)
    path = hp.save_pruned(model, tmp_path / "m")
    assert hp.load_pruned(path).config._attn_implementation == attn
    assert T.AutoConfig.from_pretrained(path)._attn_implementation == attn
    other = "sdpa" if attn == "eager" else "eager"
    assert hp.load_pruned(path, attn_implementation=other).config._attn_implementation == other


@pytest.mark.parametrize("prune", [True, False])
def test_saved_dtype_is_kept_and_can_be_overridden(prune, tmp_path):
    model = _model("bart").to(torch.bfloat16)
    if prune:
        hp.prune_heads(model, PLANS["bart"], verify=False)
    path = hp.save_pruned(model, tmp_path / "m")
    loaded = hp.load_pruned(path)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True))
    wide = hp.load_pruned(path, dtype=torch.float32)
    assert {p.dtype for p in wide.parameters()} == {torch.float32}
    assert all(torch.equal(a.float(), b) for a, b in zip(model.state_dict().values(), wide.state_dict().values(),
                                                           strict=True))


def test_device_is_where_the_model_ends_up(tmp_path):
    _, path = _pruned("llama", tmp_path)
    assert {p.device.type for p in hp.load_pruned(path).parameters()} == {"cpu"}
    meta = hp.load_pruned(path, device="meta")  # any torch device; meta needs no accelerator
    assert {p.device.type for p in meta.parameters()} == {"meta"}


def test_unpruned_directory_is_plain_transformers(tmp_path):
    model = _model("bert")
    path = hp.save_pruned(model, tmp_path / "m")
    assert (path / "model.safetensors").is_file() and not (path / "HEADPRUNE.md").exists()
    assert "transformers_weights" not in json.loads((path / "config.json").read_text())
    plain = T.AutoModelForSequenceClassification.from_pretrained(path)
    x = inputs("bert")
    assert _close(_logits(plain, x), _logits(model, x)) and _close(_logits(hp.load_pruned(path), x), _logits(model, x))


# ---------------------------------------------------------------- 3. bad input: one typed line


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("content", [b"", b"not a safetensors file at all" * 3, "truncate"])
def test_broken_weights_file(content, tmp_path):
    _, path = _pruned("bert", tmp_path)
    file = path / "pruned.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2] if content == "truncate" else content)
    with pytest.raises(hp.DataError) as excinfo:
        hp.load_pruned(path)
    assert "pruned.safetensors" in _one_line(excinfo) and str(path) in str(excinfo.value)


@pytest.mark.parametrize("changes, error, pattern", [
    ({"model_type": "no-such-model"}, hp.UnsupportedModelError, r"model_type 'no-such-model'"),
    ({"auto_map": {"AutoModel": "modeling_x.XModel"}}, hp.UnsupportedModelError, r"custom code"),
    ({"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}}, hp.UnsupportedModelError,
     r"quantized .*'bitsandbytes'"),
    ({"headprune_kept_heads": "encoder.0.self"}, hp.PlanError, r"must be a mapping"),
    ({"headprune_kept_heads": {"encoder.1.self": [0, 1]}}, hp.PlanError, r"do not fit the kept heads"),
    ({"headprune_kept_heads": {"encoder.1.self": [0, 9]}}, hp.PlanError, r"head index 9 out of range"),
    ({"headprune_kept_heads": {"decoder.0.self": [0]}}, hp.PlanError, r"unknown site 'decoder.0.self'"),
    ({"headprune_original_heads": "4"}, hp.PlanError, r"headprune_original_heads .* must be a mapping"),
])
def test_bad_config_is_refused_by_name(changes, error, pattern, tmp_path):
    _, path = _pruned("bert", tmp_path)
    _edit_config(path, **changes)
    with pytest.raises(error, match=pattern) as excinfo:
        hp.load_pruned(path)
    assert str(path) in _one_line(excinfo)


def test_garbage_config_and_missing_weights(tmp_path):
    _, path = _pruned("bert", tmp_path)
    (path / "pruned.safetensors").unlink()
    with pytest.raises(hp.DataError, match="no weights"):
        hp.load_pruned(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(hp.DataError, match="config.json"):
        hp.load_pruned(path)


def test_save_refuses_a_file_and_a_non_empty_directory(tmp_path):
    model = _model("bert")
    file = tmp_path / "file"
    file.write_text("keep me")
    with pytest.raises(hp.ConfigError, match="is a file"):
        hp.save_pruned(model, file)
    assert file.read_text() == "keep me"
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    with pytest.raises(hp.ConfigError, match="not empty"):
        hp.save_pruned(model, full)
    assert os.listdir(full) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert hp.save_pruned(model, empty) == empty and (empty / "config.json").is_file()


@pytest.mark.parametrize("prune", [True, False])
def test_a_failed_save_leaves_nothing(prune, tmp_path, monkeypatch):
    model = _model("bert")
    if prune:
        hp.prune_heads(model, PLANS["bert"], verify=False)

    def full_disk(directory, *args, **kwargs):
        (directory / "config.json").write_text("{}")  # something written, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model, "save_pretrained", full_disk)
    root = tmp_path / "out"
    root.mkdir()
    with pytest.raises(OSError, match="No space left"):
        hp.save_pruned(model, root / "m")
    assert os.listdir(root) == []  # no output directory and no temporary one


def test_cli_prune_writes_through_the_atomic_save(tmp_path, monkeypatch):
    source = hp.save_pruned(_model("bert"), tmp_path / "bert")
    out = tmp_path / "pruned"

    save = T.PreTrainedModel.save_pretrained

    def full_disk(self, directory, *args, **kwargs):
        if not directory.name.startswith(f".{out.name}."):  # prune_heads' own check saves a model too
            return save(self, directory, *args, **kwargs)
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(T.PreTrainedModel, "save_pretrained", full_disk)
        result = CliRunner().invoke(app, ["prune", str(source), "--drop", '{"encoder.1.self": [0]}', "-o", str(out)])
    assert result.exit_code == 2 and "No space left" in result.output
    assert sorted(os.listdir(tmp_path)) == ["bert"]
    result = CliRunner().invoke(app, ["prune", str(source), "--drop", '{"encoder.1.self": [0]}', "-o", str(source)])
    assert result.exit_code == 2 and "already exists" in result.output
    result = CliRunner().invoke(app, ["prune", str(source), "--drop", '{"encoder.1.self": [0]}', "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert hp.kept_heads(hp.load_pruned(out))["encoder.1.self"] == [1, 2, 3]


# ---------------------------------------------------------------- 4. plain transformers refuses a pruned directory


@pytest.mark.parametrize("load", [T.AutoModelForSequenceClassification.from_pretrained,
                                  T.BertForSequenceClassification.from_pretrained, T.AutoModel.from_pretrained])
def test_plain_from_pretrained_fails_loudly_naming_load_pruned(load, tmp_path):
    _, path = _pruned("bert", tmp_path)  # encoder.0.self lost every head
    with pytest.raises(ValueError, match=r"headprune\.load_pruned"):
        load(path)
    assert "headprune.load_pruned" in (path / "HEADPRUNE.md").read_text()
    config = json.loads((path / "config.json").read_text())
    del config["transformers_weights"]  # a transformers that ignores the marker: no weights file it knows
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(OSError, match="model.safetensors"):
        load(path)
    hp.load_pruned(path)  # headprune still loads it


@pytest.mark.parametrize("family, legacy", [("bert", False), ("bert", True), ("mixtral", False)])
def test_directories_of_the_previous_layout_still_load(family, legacy, tmp_path):
    model = _model(family)
    hp.prune_heads(model, PLANS[family], verify=False)
    path = tmp_path / "old"
    model.save_pretrained(path)  # what headprune <= 0.2 wrote: model.safetensors, kept heads in config.json
    if legacy:  # headprune 0.1.0's key names
        config = json.loads((path / "config.json").read_text())
        config["headprune_plan"] = config.pop("headprune_kept_heads")
        config["headprune_heads"] = config.pop("headprune_original_heads")
        (path / "config.json").write_text(json.dumps(config))
    loaded = hp.load_pruned(path)
    assert hp.kept_heads(loaded) == hp.kept_heads(model)
    x = _inputs(family)
    assert _close(_logits(loaded, x), _logits(model, x))


def test_sharded_pruned_save_reloads_and_is_refused_by_plain_transformers(tmp_path, monkeypatch):
    model = _model("gpt2")
    hp.prune_heads(model, PLANS["gpt2"], verify=False)
    save = model.save_pretrained
    monkeypatch.setattr(model, "save_pretrained", lambda d, **kw: save(d, max_shard_size="20KB", **kw))
    path = hp.save_pruned(model, tmp_path / "m")
    assert (path / "pruned.safetensors.index.json").is_file() and len(list(path.glob("model-*.safetensors"))) > 1
    assert not (path / "model.safetensors.index.json").exists()
    with pytest.raises(ValueError, match=r"headprune\.load_pruned"):
        T.AutoModelForCausalLM.from_pretrained(path)
    x = inputs("gpt2")
    assert _close(_logits(hp.load_pruned(path), x), _logits(model, x))
