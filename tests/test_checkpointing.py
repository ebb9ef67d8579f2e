"""Checkpointed scoring (one input kept per block, activations recomputed) gives the plain pass's I_h."""

from __future__ import annotations

import pytest
import torch

import headprune as hp
from headprune.scoring import checkpointed_blocks, mask_gradients
from headprune.scoring.checkpointing import transformer_blocks
from tiny import build, inputs, labels


def _batch(family, batch=3, seed=1):
    x = inputs(family, batch=batch, seed=seed)
    x["labels"] = labels(family, x)
    return x


def _saved_bytes(model, batch) -> int:
    """Bytes autograd keeps for the backward pass during one mask-gradient forward."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mask_gradients(model, batch)
    return total[0]


@pytest.mark.parametrize("family", ["llama", "bert", "gpt2", "bart"])
def test_checkpointed_importance_equals_the_plain_pass(family):
    model = build(family)
    batches = [_batch(family, seed=1), _batch(family, batch=2, seed=5)]
    plain = hp.head_importance(model, batches, normalize=None)
    with checkpointed_blocks(model):
        ckpt = hp.head_importance(model, batches, normalize=None)
    assert all(p.grad is None for p in model.parameters())  # no parameter gradients
    for name, ref in plain.items():
        scale = float(ref.abs().max())
        assert scale > 0
        assert float((ckpt[name] - ref).abs().max()) <= 1e-5 * scale, name


def test_checkpointing_keeps_less_for_the_backward_and_is_undone():
    model = build("llama")
    batch = inputs("llama", batch=2, length=40)
    blocks = transformer_blocks(model)
    assert blocks == list(model.model.layers)
    plain = _saved_bytes(model, batch)
    with checkpointed_blocks(model):
        ckpt = _saved_bytes(model, batch)
    assert ckpt < 0.7 * plain, (ckpt, plain)
    assert all("forward" not in b.__dict__ for b in blocks)  # the class's forward is back
    assert _saved_bytes(model, batch) == plain
