"""``PruneSettings(steps=k)``: k rounds of score, select, stand-in and cut, each on the model the round before left.
Checked against two public ``compress`` calls made here (the second on the first's model, its share computed here
from parameter counts), and the dropped indices against the weights: with no compensation a kept neuron's column of
the down projection is the unpruned one's."""

from __future__ import annotations

import pytest
import torch

import headprune as hp
from headprune.compression import PruneSettings, compress
from headprune.errors import ConfigError
from tiny import build, inputs, labels

BASE = dict(units="both", price="params", scores="fisher", seq_len=16)


def _batches(n=3):
    out = []
    for s in range(n):
        x = inputs("llama", batch=5, seed=s, pad=False)
        out.append({**x, "labels": labels("llama", x, seed=s)})
    return out


def _pool_params(model) -> int:
    """Parameters of the blocks' weight matrices (q, k, v, o, gate, up, down: what heads and neurons are priced in)."""
    return sum(p.numel() for p in model.model.layers.parameters() if p.dim() == 2)


def test_two_rounds_equal_two_calls_on_the_smaller_model():
    torch.manual_seed(0)
    model, batches = build("llama"), _batches()
    share = 0.5
    got = compress(model, batches, PruneSettings(**BASE, share=share, compensate="obs-seq", damping=0.01, steps=2))
    p0 = _pool_params(model)
    first = compress(model, batches, PruneSettings(**BASE, share=1 - (1 - share) / 2, compensate="obs-seq",
                                                   damping=0.01))
    second = compress(first.model, batches, PruneSettings(**BASE, share=p0 * share / _pool_params(first.model),
                                                          compensate="obs-seq", damping=0.01))
    probe = inputs("llama", batch=3, seed=9, pad=False)
    with torch.no_grad():
        a, b = got.model(**probe).logits, second.model(**probe).logits
    assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())
    assert _pool_params(got.model) <= share * p0
    assert "steps" in got.selection and len(got.selection["steps"]) == 2


@pytest.mark.parametrize("low_memory", [False, True])
def test_dropped_indices_are_of_the_model_passed(low_memory):
    """Also with ``low_memory`` (the first round cuts the model passed in place): the indices are still of the model
    as it was passed, read here from weights copied before the call."""
    torch.manual_seed(0)
    model, batches = build("llama"), _batches()
    before = {f.name: f.down.weight.detach().clone() for f in hp.find_ffns(model)}
    width = {s.name: s.num_heads for s in hp.find_sites(model)}
    got = compress(model, batches, PruneSettings(**BASE, share=0.4, compensate="none", steps=3, low_memory=low_memory))
    assert any(got.dropped_neurons.values()) and any(got.dropped_heads.values())
    for ffn in hp.find_ffns(got.model):
        kept = [j for j in range(before[ffn.name].shape[1]) if j not in set(got.dropped_neurons[ffn.name])]
        assert torch.equal(ffn.down.weight.detach(), before[ffn.name][:, kept])
    assert got.plan.dropped_neurons == got.dropped_neurons
    for site in hp.find_sites(got.model):
        assert site.num_heads == width[site.name] - len(got.dropped_heads[site.name])


def test_steps_refused_where_they_cannot_run():
    with pytest.raises(ConfigError, match="steps=2 with the head plan"):
        PruneSettings(units="heads", share=0.5, steps=2)
    with pytest.raises(ConfigError, match="steps=0"):
        PruneSettings(**BASE, share=0.5, steps=0)
    model = build("llama")
    prices = hp.compression.pool.unit_costs(model, "params")
    with pytest.raises(ConfigError, match="prices= with steps=2"):
        compress(model, _batches(1), PruneSettings(units="both", price="latency", share=0.5, steps=2), prices=prices)
