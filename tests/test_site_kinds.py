"""A site's kind follows what its block does, and a model headprune cannot read is refused by name."""

from __future__ import annotations

import pytest
import torch
import transformers as T

import headprune as hp

C = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **C)


def _kinds(model) -> dict[str, str]:
    return {s.name: s.kind for s in hp.find_sites(model)}


def test_a_causal_bert_is_a_decoder_and_a_plain_one_an_encoder():
    assert _kinds(T.BertLMHeadModel(T.BertConfig(is_decoder=True, **BERT))) == {
        "decoder.0.self": "decoder", "decoder.1.self": "decoder"}
    assert _kinds(T.BertForSequenceClassification(T.BertConfig(**BERT))) == {
        "encoder.0.self": "encoder", "encoder.1.self": "encoder"}


def test_xglm_causal_stack_without_decoder_in_its_path_is_a_decoder():
    model = T.XGLMForCausalLM(T.XGLMConfig(d_model=32, num_layers=2, attention_heads=4, ffn_dim=37,
                                           max_position_embeddings=64, **C))
    assert _kinds(model) == {"decoder.0.self": "decoder", "decoder.1.self": "decoder"}


def test_nllb_moe_cross_attention_is_found_as_cross():
    config = T.NllbMoeConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                             decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, num_experts=2,
                             expert_capacity=4, max_position_embeddings=64, decoder_start_token_id=2, **C)
    kinds = _kinds(T.NllbMoeForConditionalGeneration(config))
    assert kinds == {"encoder.0.self": "encoder", "encoder.1.self": "encoder", "decoder.0.self": "decoder",
                     "decoder.0.cross": "cross", "decoder.1.self": "decoder", "decoder.1.cross": "cross"}


def test_a_quantized_model_is_refused_by_name():
    model = T.BertForSequenceClassification(T.BertConfig(**BERT))
    quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    with pytest.raises(hp.UnsupportedModelError, match="is quantized"):
        hp.find_sites(quantized)
