"""Scoring under activation checkpointing: the same I_h and Fisher, with each block really recomputed."""

from __future__ import annotations

import pytest
import torch

import headprune as hp
from headprune.scoring.checkpointing import blocks, checkpointed
from tiny import build, inputs, labels


def _batches(family):
    out = []
    for seed in (1, 2):
        x = inputs(family, batch=3, seed=seed)
        x["labels"] = labels(family, x, seed=seed)
        out.append(x)
    return out


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "bart", "t5"])
def test_checkpointed_scores_equal_plain_scores(family):
    model, batches = build(family), _batches(family)
    layers = model.config.num_hidden_layers * (2 if model.config.is_encoder_decoder else 1)
    assert len(blocks(model)) == layers
    site = hp.find_sites(model)[0]
    calls = []
    handle = site.o.register_forward_pre_hook(lambda *_: calls.append(1))
    want = hp.head_importance(model, batches, normalize=None)
    plain = len(calls)
    got = hp.head_importance(model, batches, normalize=None, checkpoint=True)
    handle.remove()
    assert len(calls) - plain == 2 * plain  # each block's forward ran again in the backward
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-7 * float(want[name].abs().max()))
    fisher, fisher_ck = hp.fisher_information(model, batches), hp.fisher_information(model, batches, checkpoint=True)
    for name in fisher.blocks:
        assert torch.allclose(fisher_ck.blocks[name], fisher.blocks[name], rtol=1e-5,
                              atol=1e-9 * float(fisher.blocks[name].abs().max()))
    assert all("forward" not in b.__dict__ for b in blocks(model))  # restored


def test_checkpointed_restores_forward_after_an_error():
    model = build("bert")
    with pytest.raises(RuntimeError), checkpointed(model) as wrapped:
        assert wrapped and all("forward" in b.__dict__ for b in wrapped)
        raise RuntimeError("boom")
    assert all("forward" not in b.__dict__ for b in blocks(model))
