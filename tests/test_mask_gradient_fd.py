"""Finite differences: the per-example mask gradient equals the slope of the model's own ``.loss``.

In float64, for every example b and head h: (loss_b(xi_h = 1 + eps) - loss_b(xi_h = 1 - eps)) / 2 eps,
with loss_b the model's own ``outputs.loss`` on example b alone (its row of the batch, padding and
all), against row b of :func:`headprune.scoring.gradients.mask_gradients` on the whole batch.

Causal LMs: transformers computes their ``.loss`` in float32 (``ForCausalLMLoss`` casts the logits),
too coarse for a finite difference; there the next-token loss is recomputed in float64 from the
logits, and checked equal to ``.loss`` to float32 precision on every call. The left-padded causal row
does not score the prediction made *from* its last pad position (HF's loss would): that position's
attention row is fully masked, its float64 forward absorbs the perturbation (score + dtype-min ==
dtype-min), so a finite difference there measures rounding, not the function. Llama-like models
are not used: their RMSNorm and rotary tables compute in float32 even in a float64 model.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import headprune as hp
from headprune.scoring.gradients import mask_gradients
from tiny import build, inputs, labels

EPS = 1e-6


def _own_loss(model, batch: dict, site: str, head: int, value: float, num_heads: int) -> float:
    mask = torch.ones(num_heads, dtype=torch.float64)
    mask[head] = value
    with torch.no_grad(), hp.masked(model, {site: mask}):
        out = model(**batch)
    if out.loss.dtype == torch.float64:
        return float(out.loss)
    logits, target = out.logits[:, :-1], batch["labels"][:, 1:]  # next-token loss, float64
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)
    assert float(loss) == pytest.approx(float(out.loss), rel=1e-5)
    return float(loss)


@pytest.mark.parametrize("family", ["bert", "gpt2", "bart"])
def test_mask_gradient_matches_finite_differences_of_the_models_loss(family):
    model = build(family).double()
    with torch.no_grad():  # larger weights than the init's: heads that matter, gradients well above rounding
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
    batch = inputs(family, batch=3)
    batch["labels"] = labels(family, batch)
    if family == "gpt2":  # left padding: the first real token is predicted from a pad position
        pads = (batch["attention_mask"] == 0).sum(-1)
        for b in range(3):
            if pads[b]:
                batch["labels"][b, pads[b]] = -100
    grads, valid = mask_gradients(model, batch)
    assert bool(valid.all())
    scale = max(float(g.abs().max()) for g in grads.values())
    assert scale > 1e-3  # a gradient worth checking
    sites = hp.find_sites(model)
    for b in range(3):
        row = {k: v[b:b + 1] for k, v in batch.items()}
        for site in sites:
            for head in range(site.num_heads):
                up = _own_loss(model, row, site.name, head, 1 + EPS, site.num_heads)
                down = _own_loss(model, row, site.name, head, 1 - EPS, site.num_heads)
                fd = (up - down) / (2 * EPS)
                got = float(grads[site.name][b, head])
                assert abs(fd - got) <= 1e-5 * scale, (family, b, site.name, head, fd, got)
