"""Pruned models people can ship: a stock transformers config when the pruned shape is expressible."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.core.store.stock import stock_config
from headprune.selection.budgets import Budget, HeadRule
from headprune.selection.gqa import kv_groups, select_gqa
from tiny import build, inputs

GQA_FAMILIES = ["llama", "qwen2", "mistral"]
AUTO = {"llama": transformers.AutoModelForCausalLM, "qwen2": transformers.AutoModelForCausalLM,
        "mistral": transformers.AutoModelForCausalLM, "bert": transformers.AutoModelForSequenceClassification}


def _even_uniform_plan(model, seed=0):
    """--gqa uniform with the same scores in every layer: the same heads dropped in every layer."""
    g = torch.Generator().manual_seed(seed)
    groups = kv_groups(model)
    one = torch.rand(len(next(iter(groups.values()))), generator=g, dtype=torch.float64)
    n_groups = len(set(next(iter(groups.values()))))  # one uniform step per site
    return select_gqa({name: one for name in groups}, groups, Budget.of(n_drop=n_groups * len(groups)),
                      HeadRule(gqa="uniform"))


@pytest.mark.parametrize("family", GQA_FAMILIES)
def test_even_uniform_pruning_reloads_with_plain_from_pretrained(family, tmp_path):
    model = build(family)
    plan = _even_uniform_plan(model)
    assert len({len(v) for v in plan.values()}) == 1 and len(plan) == len(hp.find_sites(model))
    hp.prune_heads(model, plan)
    hp.save_pruned(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    site = hp.find_sites(model)[0]
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (site.num_heads, site.num_kv_heads)
    assert "transformers_weights" not in config
    plain = AUTO[family].from_pretrained(tmp_path / "m").eval()
    assert type(plain) is type(model)
    x = inputs(family, pad=False)
    with torch.no_grad():
        want, got = model(**x).logits, plain(**x).logits
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
        kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
        assert torch.equal(plain.generate(**x, **kw), model.generate(**x, **kw))
    again = hp.load_pruned(tmp_path / "m")  # headprune reads it too
    with torch.no_grad():
        assert torch.equal(again(**x).logits, got)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_a_half_precision_model_on_its_device_is_saved_stock(device, tmp_path):
    """A model cast with ``.to(bfloat16)`` keeps rotary ``inv_freq`` in bfloat16, where ``from_pretrained``
    rebuilds it in float32: one bfloat16 eps apart, so the stock check bounds by the dtype (4 eps), and it
    compares on the model's own device (a CUDA model was once checked against a CPU reload and refused)."""
    config = transformers.LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                      head_dim=16, intermediate_size=256, vocab_size=512)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()
    assert model.model.rotary_emb.inv_freq.dtype == torch.bfloat16  # the case: a buffer cast with the weights
    hp.prune_heads(model, {f"decoder.{i}.self": [0, 2, 4, 6] for i in range(2)})
    hp.save_pruned(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert "headprune_layout_reason" not in config and "transformers_weights" not in config
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.bfloat16).to(device).eval()
    x = torch.randint(3, 512, (2, 64), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        want, got = model(x).logits.float(), plain(x).logits.float()
    assert (got - want).abs().max() <= 4 * torch.finfo(torch.bfloat16).eps * want.abs().max()


@pytest.mark.parametrize("family, plan", [
    ("llama", {"decoder.0.self": [0, 3]}),  # one layer pruned, the other not
    ("llama", {"decoder.0.self": [0], "decoder.1.self": [0]}),  # uneven GQA: key/value heads repeated
    ("llama", {"decoder.0.self": list(range(6)), "decoder.1.self": [0, 3]}),  # a site emptied
    ("bert", {"encoder.0.self": [0], "encoder.1.self": [1]}),  # head size from hidden_size / heads
])
def test_inexpressible_shapes_are_refused_by_plain_from_pretrained(family, plan, tmp_path):
    model = build(family)
    hp.prune_heads(model, plan)
    config, reason = stock_config(model)
    assert config is None and reason
    hp.save_pruned(model, tmp_path / "m")
    with pytest.raises(Exception, match=r"headprune\.load_pruned"):
        AUTO[family].from_pretrained(tmp_path / "m")
    x = inputs(family)
    with torch.no_grad():
        want = model(**x).logits
        assert torch.equal(hp.load_pruned(tmp_path / "m")(**x).logits, want)


def test_unpruned_and_stock_false(tmp_path):
    model = build("llama")
    assert stock_config(model) == (None, "the model is not pruned")
    hp.prune_heads(model, _even_uniform_plan(model))
    hp.save_pruned(model, tmp_path / "m", stock=False)
    with pytest.raises(Exception, match=r"headprune\.load_pruned"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m")


def test_cli_prune_writes_a_stock_directory(tmp_path):
    hp.save_pruned(build("llama"), tmp_path / "llama")
    drop = json.dumps({"decoder.0.self": [0, 3], "decoder.1.self": [0, 3]})
    r = CliRunner().invoke(app, ["prune", str(tmp_path / "llama"), "--drop", drop, "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert plain.config.num_attention_heads == 4 and plain.config.num_key_value_heads == 2


@pytest.mark.parametrize("mode", ["uniform", "groups"])
def test_compress_same_per_site_ships_a_stock_directory(mode, tmp_path):
    from headprune.compression import PruneSettings, compress
    from tiny import labels

    model = build("llama")
    x = inputs("llama", batch=4)
    x["labels"] = labels("llama", x)
    result = compress(model, [x], PruneSettings(share=0.5, price="count", compensate="tune", gqa=mode,
                                               same_per_site=True))
    kept = {len(v) for v in result.kept_heads.values()}
    assert len(kept) == 1 and kept != {6}
    hp.save_pruned(result.model, tmp_path / "m")
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    y = inputs("llama", pad=False)
    with torch.no_grad():
        want = result.model(**y).logits
        assert (plain(**y).logits - want).abs().max() <= 1e-5 * want.abs().max()


def test_same_per_site_refuses_free_and_other_budgets():
    from headprune.compression import PruneSettings
    from headprune.errors import ConfigError

    with pytest.raises(ConfigError, match="same_per_site"):
        PruneSettings(share=0.5, price="count", gqa="free", same_per_site=True)
    with pytest.raises(ConfigError, match="same_per_site"):
        PruneSettings(share=0.5, price="flops", same_per_site=True)


def test_stock_is_used_where_the_config_can_say_the_shape(tmp_path):
    """Qwen3 reads head_dim and does not tie it to hidden_size: 8 -> 6 heads of 8 is a stock directory."""
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
        intermediate_size=37, vocab_size=64, max_position_embeddings=64, pad_token_id=0)).eval()
    hp.prune_heads(model, {s.name: [0, 4] for s in hp.find_sites(model)})
    hp.save_pruned(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["num_attention_heads"], config["head_dim"]) == (6, 8) and "headprune_layout_reason" not in config
    x = {"input_ids": torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(1))}
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        want = model(**x).logits
        assert (plain(**x).logits - want).abs().max() <= 1e-5 * want.abs().max()


def test_a_stock_form_that_fails_anywhere_falls_back_and_says_why(tmp_path, monkeypatch, caplog):
    model = build("llama")
    hp.prune_heads(model, _even_uniform_plan(model))
    before = ({k: v.clone() for k, v in model.state_dict().items()}, model.config.to_json_string())

    def broken(*args, **kwargs):
        raise RuntimeError("reload exploded\nsecond line")

    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained", broken)  # the stock check's reload
    with caplog.at_level("WARNING", logger="headprune"):
        hp.save_pruned(model, tmp_path / "m")
    reason = json.loads((tmp_path / "m" / "config.json").read_text())["headprune_layout_reason"]
    assert "RuntimeError: reload exploded" in reason and "\n" not in reason
    assert [r.getMessage().count("\n") for r in caplog.records if r.name == "headprune"] == [0]
    assert "reload exploded" in caplog.text
    after = model.state_dict()  # saving changed nothing
    assert all(torch.equal(after[k], v) for k, v in before[0].items()) and model.config.to_json_string() == before[1]
    monkeypatch.undo()
    x = inputs("llama", pad=False)
    with torch.no_grad():
        want = model(**x).logits
        assert (hp.load_pruned(tmp_path / "m")(**x).logits - want).abs().max() <= 1e-5 * want.abs().max()
    assert not hasattr(hp.load_pruned(tmp_path / "m").config, "headprune_layout_reason")


def test_an_unexpected_save_error_is_typed_and_leaves_nothing(tmp_path, monkeypatch):
    model = build("bert")

    def refuses(*args, **kwargs):
        raise ValueError("transformers refuses this config")

    monkeypatch.setattr(model, "save_pretrained", refuses)
    with pytest.raises(hp.HeadpruneError, match=r"save_pruned could not write .*ValueError: transformers refuses"):
        hp.save_pruned(model, tmp_path / "out" / "m")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("family", GQA_FAMILIES)
def test_uniform_heads_and_ffn_neurons_reload_with_plain_from_pretrained(family, tmp_path):
    """The same heads and the same FFN width in every layer is a stock shape: the config's FFN size follows, and
    plain from_pretrained computes the pruned model's logits; one layer of another width is headprune's layout."""
    model = build(family)
    hp.prune_heads(model, _even_uniform_plan(model))
    ffns = hp.find_ffns(model)
    width = ffns[0].width
    hp.prune_neurons(model, {f.name: list(range(0, width, 3)) for f in ffns})
    hp.save_pruned(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["intermediate_size"] == hp.find_ffns(model)[0].width == width - len(range(0, width, 3))
    assert "headprune_kept_neurons" not in config and config["headprune_stock"]["kept_neurons"]
    plain = AUTO[family].from_pretrained(tmp_path / "m").eval()
    x = inputs(family, pad=False)
    with torch.no_grad():
        want, got = model(**x).logits, plain(**x).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    hp.prune_neurons(model, {ffns[0].name: [0]})  # one FFN narrower than the others
    hp.save_pruned(model, tmp_path / "uneven")
    assert not (tmp_path / "uneven" / "model.safetensors").exists()
    assert "different numbers of neurons" in json.loads((tmp_path / "uneven" / "config.json").read_text())[
        "headprune_layout_reason"]
    again = hp.load_pruned(tmp_path / "uneven")
    with torch.no_grad():
        assert (again(**x).logits - model(**x).logits).abs().max() <= 1e-5 * want.abs().max()
