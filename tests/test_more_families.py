"""Families the core issue does not list: found by shape, pruned == masked; others refused by name."""

from __future__ import annotations

import pytest
import torch
import transformers as T

import headprune as hp
from test_core_equivalence import random_plans

C = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
S2S = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
           encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64, decoder_start_token_id=2)
MORE = {
    "opt": lambda: T.OPTForCausalLM(T.OPTConfig(hidden_size=32, num_hidden_layers=2, ffn_dim=37, num_attention_heads=4,
                                                max_position_embeddings=64, word_embed_proj_dim=32, **C)),
    "gptj": lambda: T.GPTJForCausalLM(T.GPTJConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, **C)),
    "gpt_neo": lambda: T.GPTNeoForCausalLM(T.GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=4,
                                                          attention_types=[[["global", "local"], 1]],
                                                          max_position_embeddings=64, **C)),
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                             intermediate_size=37, max_position_embeddings=64, **C)),
    "xlm_roberta": lambda: T.XLMRobertaForSequenceClassification(T.XLMRobertaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, max_position_embeddings=70, **C)),
    "deberta_v2": lambda: T.DebertaV2ForSequenceClassification(T.DebertaV2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, relative_attention=True,
        pos_att_type=["p2c", "c2p"], max_relative_positions=16, **C)),
    "mbart": lambda: T.MBartForConditionalGeneration(T.MBartConfig(**S2S, **C)),
    "pegasus": lambda: T.PegasusForConditionalGeneration(T.PegasusConfig(**S2S, **C)),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=8, intermediate_size=37,
                                                      max_position_embeddings=64, **C)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=8, intermediate_size=37,
                                                      max_position_embeddings=64, **C)),
    "mt5": lambda: T.MT5ForConditionalGeneration(T.MT5Config(d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                                             decoder_start_token_id=0, vocab_size=64, pad_token_id=0,
                                                             eos_token_id=2)),
}


def _build(family):
    torch.manual_seed(0)
    return MORE[family]().eval()


def _inputs(model):
    g = torch.Generator().manual_seed(3)
    x = {"input_ids": torch.randint(3, 64, (2, 7), generator=g), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    if model.config.is_encoder_decoder:
        x["decoder_input_ids"] = torch.randint(3, 64, (2, 5), generator=g)
    return x


@pytest.mark.parametrize("family", list(MORE))
def test_more_families_pruned_equals_masked(family):
    sites = hp.find_sites(_build(family))
    assert sites and all(s.num_heads == 4 for s in sites)
    for plan in random_plans(sites, 6, seed=11):
        model = _build(family)
        x = _inputs(model)
        with torch.no_grad(), hp.masked(model, hp.mask_from_heads(model, plan)):
            want = model(**x).logits
        hp.prune_heads(model, plan)
        with torch.no_grad():
            got = model(**x).logits
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), (family, plan)


@pytest.mark.parametrize("family", ["gpt_neox", "qwen3", "mbart"])
def test_more_families_generate(family):
    plan = {"decoder.0.self": [0, 1, 2, 3], "decoder.1.self": [1]}
    model = _build(family)
    x = {k: v for k, v in _inputs(model).items() if k != "decoder_input_ids"}
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    with torch.no_grad(), hp.masked(model, hp.mask_from_heads(model, plan)):
        want = model.generate(**x, **kw)
    hp.prune_heads(model, plan)
    with torch.no_grad():
        assert torch.equal(model.generate(**x, **kw), want)


@pytest.mark.parametrize("config, reason", [
    (lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=32, n_layer=2, n_head=4, **C)), "ALiBi"),
    (lambda: T.AlbertForSequenceClassification(T.AlbertConfig(embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                                               num_attention_heads=4, intermediate_size=37, **C)),
     "shared by every layer"),
])
def test_families_that_would_prune_wrong_are_refused(config, reason):
    with pytest.raises(hp.UnsupportedModelError, match=reason):
        hp.find_sites(config())
