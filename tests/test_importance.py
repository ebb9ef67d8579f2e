"""I_h: exact per-example |dL/dxi| in one backward, checked against one backward per example."""

from __future__ import annotations

import pytest
import torch

import headprune as hp
from headprune.scoring.gradients import per_example_loss
from tiny import build, inputs, labels


def _batch(family, batch=4, seed=1):
    x = inputs(family, batch=batch, seed=seed)
    x["labels"] = labels(family, x)
    return x


def _brute_force(model, batches):
    """One forward + backward per example with a [H] mask per site; |grad| then mean."""
    sites = hp.find_sites(model)
    total = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in sites}
    n = 0
    for batch in batches:
        for i in range(batch["input_ids"].shape[0]):
            one = {k: v[i : i + 1] for k, v in batch.items()}
            xi = hp.ones_mask(model, requires_grad=True)
            with hp.masked(model, xi):
                out = model(**{k: v for k, v in one.items() if k != "labels" or model.config.is_encoder_decoder})
                loss, valid = per_example_loss(model, one, out)
            if not bool(valid.all()):
                continue
            loss.sum().backward()
            for s in sites:
                total[s.name] += xi[s.name].grad.abs().double()
            n += 1
    return {k: (v / n).float() for k, v in total.items()}


@pytest.mark.parametrize("family", ["bert", "distilbert", "gpt2", "llama", "bart", "t5"])
def test_one_backward_equals_brute_force(family):
    model = build(family)
    batches = [_batch(family, seed=1), _batch(family, batch=3, seed=5)]
    fast = hp.head_importance(model, batches, normalize=None)
    assert all(p.grad is None for p in model.parameters())  # no parameter gradients
    slow = _brute_force(model, batches)
    for name in slow:
        assert torch.allclose(fast[name], slow[name], atol=1e-5, rtol=1e-4), name


def test_batch_variant_is_abs_of_sum_and_l2_normalised():
    model = build("bert")
    batches = [_batch("bert", seed=3)]
    grads, valid = hp.mask_gradients(model, batches[0])
    n = int(valid.sum())
    per_batch = hp.head_importance(model, batches, normalize=None, absolute="batch")
    for name, g in grads.items():
        assert torch.allclose(per_batch[name], g[valid].sum(0).abs() / n, atol=1e-6)
    normalised = hp.head_importance(model, batches)
    for s in normalised.values():
        assert abs(s.norm().item() - 1.0) < 1e-5


def test_padded_examples_and_tokens_contribute_nothing():
    model = build("llama")
    x = _batch("llama", batch=3)
    padded = {k: torch.cat([v, v[:1]]) for k, v in x.items()}  # a 4th row that is all padding
    padded["attention_mask"][-1] = 0
    padded["labels"][-1] = -100
    a = hp.head_importance(model, [x], normalize=None)
    b = hp.head_importance(model, [padded], normalize=None)
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6)


def test_deterministic_and_model_state_restored():
    model = build("gpt2").train()
    batches = [_batch("gpt2")]
    first = hp.head_importance(model, batches)
    second = hp.head_importance(model, batches)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert not hp.is_masked(model)


def test_custom_loss_fn_and_errors():
    model = build("bert")
    x = inputs("bert")
    scores = hp.head_importance(model, [x], loss_fn=lambda out, batch: out.logits[:, 0], normalize=None)
    assert set(scores) == {"encoder.0.self", "encoder.1.self"}
    with pytest.raises(hp.ConfigError, match="labels"):
        hp.head_importance(model, [inputs("bert")])
    with pytest.raises(hp.ConfigError, match="one loss per example"):
        hp.head_importance(model, [x], loss_fn=lambda out, batch: out.logits.sum())
    with pytest.raises(hp.ConfigError, match="normalize"):
        hp.head_importance(model, [x], normalize="l1")
    with pytest.raises(hp.ConfigError, match="absolute"):
        hp.head_importance(model, [x], absolute="token")


def test_importance_on_pruned_model_has_pruned_shapes():
    model = build("bert")
    hp.prune_heads(model, {"encoder.0.self": [0, 1]})
    scores = hp.head_importance(model, [_batch("bert")])
    assert scores["encoder.0.self"].shape == (2,) and scores["encoder.1.self"].shape == (4,)
