"""An FFN keeps its name when its layer loses every head, also in an encoder family run as a causal LM (its layers
sit under an ``encoder`` path while its sites are ``decoder.N.self``): found by the peer survey on RemBERT."""

from __future__ import annotations

import torch
from transformers import RobertaConfig, RobertaForCausalLM

import headprune as hp


def test_ffn_name_survives_a_removed_site_in_an_encoder_family_decoder():
    torch.manual_seed(0)
    model = RobertaForCausalLM(RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             intermediate_size=48, is_decoder=True)).eval()
    before = [f.name for f in hp.find_ffns(model)]
    assert before == ["decoder.0.ffn", "decoder.1.ffn"]
    ids = torch.randint(4, 64, (2, 7))
    with hp.masked(model, hp.mask_from_heads(model, {"decoder.1.self": [0, 1, 2, 3]})), torch.no_grad():
        want = model(input_ids=ids).logits
    hp.prune_heads(model, {"decoder.1.self": [0, 1, 2, 3]})
    assert [f.name for f in hp.find_ffns(model)] == before  # was "encoder.1.ffn" once the site was gone
    with torch.no_grad():
        got = model(input_ids=ids).logits
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    hp.prune_neurons(model, {"decoder.1.ffn": [0, 5]})  # the name a plan made before the cut still applies
    assert hp.find_ffns(model)[1].width == 46
