"""Sites that lose every head, in families whose attention is called and answers differently:
XLM (``input``, a 1-tuple, ``cache``), MobileBERT (``query_tensor``), GPT-NeoX-Japanese (returns
its separate output bias), UMT5 (a bias table per layer, 2 outputs). Pruned == masked, forward and
cached generate; the removed forward follows what the family's attention returns."""

from __future__ import annotations

import pytest
import torch
import transformers as T

import headprune as hp
from test_more_families import _inputs

C = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
BUILD = {
    "xlm": lambda: T.XLMWithLMHeadModel(T.XLMConfig(emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64,
                                                    **C)),
    "mobilebert": lambda: T.MobileBertForSequenceClassification(T.MobileBertConfig(
        hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        intra_bottleneck_size=16, true_hidden_size=16, max_position_embeddings=64, **C)),
    "gpt_neox_japanese": lambda: T.GPTNeoXJapaneseForCausalLM(T.GPTNeoXJapaneseConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_multiple_size=1,
        max_position_embeddings=64, **C)),
    "umt5": lambda: T.UMT5ForConditionalGeneration(T.UMT5Config(
        d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        decoder_start_token_id=0, vocab_size=64, pad_token_id=0, eos_token_id=2)),
}


def _build(family):
    torch.manual_seed(0)
    return BUILD[family]().eval()


@pytest.mark.parametrize("family", list(BUILD))
def test_emptied_sites_equal_masking(family):
    model = _build(family)
    sites = hp.find_sites(model)
    plan = {sites[0].name: list(range(sites[0].num_heads)), sites[-1].name: [1, 2]}
    x = _inputs(model)
    with torch.no_grad(), hp.masked(model, hp.mask_from_heads(model, plan)):
        want = model(**x).logits
    hp.prune_heads(model, plan)
    assert sites[0].name not in {s.name for s in hp.find_sites(model)}  # the site is gone, not kept empty
    with torch.no_grad():
        got = model(**x).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max(), family


@pytest.mark.parametrize("family", ["xlm", "gpt_neox_japanese", "umt5"])
def test_emptied_sites_keep_cached_generate_identical(family):
    model = _build(family)
    sites = hp.find_sites(model)
    plan = {sites[0].name: list(range(sites[0].num_heads))}
    x = {k: v for k, v in _inputs(model).items() if k in ("input_ids", "attention_mask")}
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad(), hp.masked(model, hp.mask_from_heads(model, plan)):
        want = model.generate(**x, **kw)
    hp.prune_heads(model, plan)
    with torch.no_grad():
        got = model.generate(**x, **kw)
    assert torch.equal(got, want), family


@pytest.mark.parametrize("family", ["xlm", "mobilebert", "gpt_neox_japanese"])
def test_emptied_sites_carry_their_call_shape_without_a_trial(family, tmp_path):
    """No state that only verification fills: with this process's trial templates gone, a model pruned
    without verification computes its removed sites' call shape from the model, saves it in config.json,
    and a reload without verification runs it (a fresh process: tests/test_guarantees.py)."""
    from headprune.core.model.calls import TEMPLATES

    model = _build(family)
    sites = hp.find_sites(model)
    plan = {sites[0].name: list(range(sites[0].num_heads)), sites[1].name: [1]}
    attention = type(sites[0].attention).__name__  # before surgery re-classes it
    x = _inputs(model)
    with torch.no_grad(), hp.masked(model, hp.mask_from_heads(sites, plan)):
        want = model(**x).logits
    kept = dict(TEMPLATES)
    TEMPLATES.clear()
    try:
        hp.prune_heads(model, plan, verify=False)
        calls = model.config.headprune_calls
        assert set(calls) == {attention}
        with torch.no_grad():
            got = model(**x).logits
        hp.save_pruned(model, tmp_path / "m")
        TEMPLATES.clear()
        loaded = hp.load_pruned(tmp_path / "m", verify=False)
        assert loaded.config.headprune_calls == calls and not TEMPLATES
        with torch.no_grad():
            again = loaded(**x).logits
    finally:
        TEMPLATES.clear()
        TEMPLATES.update(kept)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert (again - want).abs().max() <= 1e-4 * want.abs().max()
