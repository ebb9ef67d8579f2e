"""The streaming prefix cache holds one layer's input and gives the full cache's (and no cache's) sweep."""

from __future__ import annotations

import random

import pytest
import torch
import transformers as T

import headprune as hp
from headprune.evaluation.lm import LanguageModelling
from headprune.experiments.ablation import SweepSettings, all_but_one, one_head_ablation
from headprune.experiments.prefix_stream import replay, streaming
from tiny import COMMON, build, inputs, word_tokenizer

TEXTS = ["the cat sat on the mat and the dog ran off", "a bird sang in the old tree by the river",
         "we went to the market and bought bread and fish", "it rained all day so the children stayed in"] * 3


def _deep(family: str):
    """Four blocks, so that moving up replays blocks below the layer held before."""
    torch.manual_seed(0)
    if family == "llama":
        model = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=48, num_hidden_layers=4, num_attention_heads=6,
                                                 num_key_value_heads=2, intermediate_size=37,
                                                 max_position_embeddings=64, **COMMON))
    else:
        model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=4, n_head=4, n_positions=64, **COMMON))
    model.set_attn_implementation("eager")
    return model.eval()


class _Logits:
    """Every batch's logits under a mask: an evaluator whose output shows any difference."""

    def __init__(self, family: str):
        self.family, self.batches = family, [inputs(family, seed=s) for s in (1, 2)]

    @torch.no_grad()
    def evaluate(self, model, mask=None, *, progress: bool = False):
        with (hp.masked(model, mask) if mask else torch.no_grad()):
            return [model(**b).logits for b in self.batches]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_streamed_sweep_equals_the_full_cache_and_no_cache(family):
    model = _deep(family)
    ev = LanguageModelling(word_tokenizer(TEXTS), TEXTS, block_size=12, batch_size=2)
    rows = {}
    for mode in (True, False, "stream"):
        sweep = one_head_ablation(model, ev, settings=SweepSettings(prefix_cache=mode), progress=False)
        rows[mode] = sweep.rows
        assert sweep.base.score == ev.evaluate(model).score
    assert len({r["score"] for r in rows[True]}) > 1  # masking heads changes the score
    assert rows["stream"] == rows[True] == rows[False]
    keep = [all_but_one(model, ev, settings=SweepSettings(prefix_cache=m), progress=False).rows
            for m in (True, "stream")]
    assert keep[0] == keep[1]


def test_stream_holds_one_layer_and_one_pass_per_layer():
    model = _deep("llama")
    ev = _Logits("llama")
    sites = hp.find_sites(model)
    with streaming(model, sites) as stream:
        ev.evaluate(model)
    assert stream.outputs == {}
    for site in sites:
        mask = {site.name: torch.tensor([0.0] + [1.0] * (site.num_heads - 1))}
        with replay(stream, site, ev):
            got = ev.evaluate(model, mask)
        assert len(stream.outputs) == (1 if site.layer > 0 else 0)
        assert all(len(v) == len(ev.batches) for v in stream.outputs.values())
        want = ev.evaluate(model, mask)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), site.name
    assert stream.passes == len(sites) - 1


@pytest.mark.parametrize("family", ["bart", "t5", "llama"])
def test_stream_in_any_order_equals_the_plain_masked_model(family):
    """Sites visited up, down and across stacks: replayed outputs equal a full masked run."""
    model = build(family)
    ev = _Logits(family)
    sites = hp.find_sites(model)
    order = sites[::-1] + random.Random(0).sample(sites, len(sites))
    with streaming(model, sites) as stream:
        base = ev.evaluate(model)
    assert all(torch.equal(g, w) for g, w in zip(base, ev.evaluate(model), strict=True))
    for site in order:
        mask = {site.name: torch.tensor([1.0] * (site.num_heads - 1) + [0.0])}
        with replay(stream, site, ev):
            got = ev.evaluate(model, mask)
        want = ev.evaluate(model, mask)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), (family, site.name)
        assert len(stream.outputs) <= len(stream.stacks)  # one held block per stack at most


def test_stream_records_the_first_sites_prefix_during_the_baseline():
    model = _deep("llama")
    ev = _Logits("llama")
    sites = hp.find_sites(model)
    with streaming(model, sites, first=sites[2]) as stream:
        ev.evaluate(model)
    assert list(stream.outputs) == [("model.layers", 1)] and stream.passes == 0
    for site in sites[2:]:
        mask = {site.name: torch.tensor([0.0] * (site.num_heads - 1) + [1.0])}
        with replay(stream, site, ev):
            got = ev.evaluate(model, mask)
        assert all(torch.equal(g, w) for g, w in zip(got, ev.evaluate(model, mask), strict=True)), site.name
    assert stream.passes == 1


def test_bad_prefix_cache_setting():
    with pytest.raises(hp.ConfigError, match="prefix_cache"):
        SweepSettings(prefix_cache="yes")
