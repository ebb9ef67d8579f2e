"""I_h against a reference that shares nothing with headprune's scoring: a gate of our own on each
output projection's input, and the model's own ``.loss`` on one example at a time (float64).

Relative error <= 1e-4 of each site's largest score (an absolute tolerance would let a large relative
error through on scores of BERT's size).
"""

from __future__ import annotations

import pytest
import torch

import headprune as hp
from test_more_families import MORE
from test_more_families import _build as build_more
from tiny import CAUSAL, FAMILIES, build, inputs, labels

REFERENCE_FAMILIES = [*FAMILIES, "opt", "gptj", "gpt_neo", "gpt_neox", "deberta_v2", "qwen3", "gemma", "mt5"]


def _model(family: str):
    model = build(family) if family in FAMILIES else build_more(family)
    return model.double()


def _batch(family: str, model, seed: int) -> dict:
    causal = family in CAUSAL or family not in FAMILIES and not model.config.is_encoder_decoder and (
        type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")))
    key = family if family in FAMILIES else ("t5" if model.config.is_encoder_decoder else
                                             "gpt2" if causal else "bert")
    x = inputs(key, batch=3, seed=seed, pad=not causal)  # float64 causal rows of pure padding are NaN
    x["labels"] = labels(key, x, seed=seed + 1)
    if not causal and not model.config.is_encoder_decoder:
        x["labels"] = x["labels"] % model.config.num_labels
    return x


def _reference(model, batches) -> dict[str, torch.Tensor]:
    """mean over examples of |d loss / d gate_h|, gate applied by our own pre-hook, loss from the model."""
    sites = hp.find_sites(model)
    total = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in sites}
    n = 0
    for batch in batches:
        for i in range(batch["input_ids"].shape[0]):
            one = {k: v[i:i + 1] for k, v in batch.items()}
            gates = {s.name: torch.ones(s.num_heads, dtype=torch.float64, requires_grad=True) for s in sites}
            handles = [s.o.register_forward_pre_hook(
                lambda mod, args, g=gates[s.name], hd=s.head_dim: (args[0] * g.repeat_interleave(hd), *args[1:]))
                for s in sites]
            try:
                loss = model(**one).loss
            finally:
                for h in handles:
                    h.remove()
            grads = torch.autograd.grad(loss, [gates[s.name] for s in sites])
            for s, g in zip(sites, grads, strict=True):
                total[s.name] += g.abs()
            n += 1
    return {k: v / n for k, v in total.items()}


@pytest.mark.parametrize("family", REFERENCE_FAMILIES)
def test_importance_equals_an_independent_reference(family):
    assert family in FAMILIES or family in MORE
    model = _model(family)
    batches = [_batch(family, model, seed=1), _batch(family, model, seed=5)]
    fast = hp.head_importance(model, batches, normalize=None)
    slow = _reference(model, batches)
    assert set(fast) == set(slow)
    for name in slow:
        scale = float(slow[name].abs().max())
        assert scale > 0, name
        error = float((fast[name].double() - slow[name]).abs().max())
        assert error <= 1e-4 * scale, f"{family} {name}: error {error:.3g} vs scores up to {scale:.3g}"
