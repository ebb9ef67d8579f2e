"""A pruned shape its family's own config refuses (LlamaConfig: ``hidden_size % num_attention_heads``) is saved as
an equivalent stock architecture of another family, kept only when plain ``from_pretrained`` of the Auto class
reloads it with equal logits; otherwise headprune's layout, as before."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import headprune as hp
from headprune.core.store.stock import equivalent_configs, stock_config


def _llama(**extra):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=6,
                                      head_dim=8, intermediate_size=40, vocab_size=64, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
    return transformers.LlamaForCausalLM(config).eval()


def _uniform(model):
    """The same head dropped from every layer: 6 -> 5 heads of 8, hidden 48 (48 % 5 != 0)."""
    hp.prune_heads(model, {s.name: [2] for s in hp.find_sites(model)})
    return model


def test_llama_config_refuses_the_shape_here():
    model = _uniform(_llama())
    config, reason = stock_config(model)
    if config is not None:
        pytest.skip(f"transformers {transformers.__version__}'s LlamaConfig accepts hidden 48 with 5 heads")
    assert "refuses" in reason


def test_uniform_llama_saves_as_an_equivalent_stock_architecture(tmp_path):
    model = _uniform(_llama())
    hp.save_pruned(model, tmp_path / "m")
    raw = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (raw["num_attention_heads"], raw["num_key_value_heads"], raw["head_dim"]) == (5, 5, 8)
    assert "headprune_stock" in raw and "transformers_weights" not in raw
    if stock_config(model)[0] is None:  # the family refuses: another family's architecture
        assert raw["model_type"] != "llama" and raw["architectures"] != ["LlamaForCausalLM"]
        assert raw.get("sliding_window") is None
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()  # no headprune involved
    g = torch.Generator().manual_seed(0)
    x = torch.randint(3, 64, (2, 40), generator=g)
    with torch.no_grad():
        want, got = model(x).logits, plain(x).logits
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
        kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
        assert torch.equal(plain.generate(x[:, :8], **kw), model.generate(x[:, :8], **kw))
        assert torch.equal(hp.load_pruned(tmp_path / "m")(x).logits, got)


def test_no_equivalent_when_the_parameters_differ(tmp_path):
    # q/k/v/o biases: Mistral has none, Qwen2 none on o_proj, so no other family builds these shapes
    model = _uniform(_llama(attention_bias=True))
    if stock_config(model)[0] is not None:
        pytest.skip("the family's own config accepts the shape")
    assert equivalent_configs(model) == []
    hp.save_pruned(model, tmp_path / "m")
    with pytest.raises(Exception, match=r"headprune\.load_pruned"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    x = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(hp.load_pruned(tmp_path / "m")(x).logits, model(x).logits)
