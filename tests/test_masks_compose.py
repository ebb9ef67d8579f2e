"""Masks compose: nested ``masked()`` blocks compute with the product of their masks and restore exactly
what was there before; scoring inside a user's block scores the masked model and leaves the user's mask.

References are independent of the hooks: the output projection's input columns of each head are
scaled (zeroed for a 0/1 mask) on a deep copy of the unmasked model, and losses are recomputed by hand.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers.pytorch_utils import Conv1D

import headprune as hp
from headprune.core.masks.masking import active_masks
from tiny import CAUSAL, build, inputs, labels

FAMILIES = ["bert", "gpt2", "llama"]


def _logits(model, x) -> torch.Tensor:
    with torch.no_grad():
        return model(**x).logits


def _assert_close(got: torch.Tensor, want: torch.Tensor, rel: float, what: str = "") -> None:
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= rel * scale, f"{what}: max |diff| {err:.3g} > {rel:g} * {scale:.3g}"


def _assert_differs(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Guard against vacuous checks: the masks compared must change the output."""
    assert (a - b).abs().max().item() > 1e-3 * b.abs().max().item(), f"{what}: the mask changed nothing"


def _scaled_copy(model, mask: dict[str, torch.Tensor]):
    """A deep copy of the (unmasked) model whose output projections read each head's slice scaled by
    ``mask`` ({site: [H]}): zeroed weight columns for xi = 0, the paper's sum_h xi_h Att_h(x)."""
    assert not hp.is_masked(model)
    ref = copy.deepcopy(model)
    sites = {s.name: s for s in hp.find_sites(ref)}
    with torch.no_grad():
        for name, xi in mask.items():
            site = sites[name]
            for h, value in enumerate(xi.tolist()):
                cols = slice(h * site.head_dim, (h + 1) * site.head_dim)
                if isinstance(site.o, Conv1D):  # weight [in, out]
                    site.o.weight[cols, :] *= value
                else:  # nn.Linear, weight [out, in]
                    site.o.weight[:, cols] *= value
    return ref


def _masks(model, kind: str) -> tuple[dict, dict]:
    """(outer, inner): the inner mask leaves the second site alone (sites missing from a mask are)."""
    s0, s1 = hp.find_sites(model)
    if kind == "binary":
        outer = hp.mask_from_heads(model, {s0.name: [1], s1.name: [0, 2]})
        inner = {s0.name: torch.ones(s0.num_heads).index_fill_(0, torch.tensor([0, 3]), 0.0)}  # not outer's
    else:
        g = torch.Generator().manual_seed(11)
        outer = {s.name: 0.3 + 1.4 * torch.rand(s.num_heads, generator=g) for s in (s0, s1)}
        inner = {s0.name: 0.3 + 1.4 * torch.rand(s0.num_heads, generator=g)}
        inner[s0.name][2] = 0.0
    return outer, inner


@pytest.mark.parametrize("kind", ["binary", "float"])
@pytest.mark.parametrize("family", FAMILIES)
def test_nested_blocks_compute_with_the_product_and_restore_exactly(family, kind):
    model = build(family)
    x = inputs(family)
    outer, inner = _masks(model, kind)
    product = {name: outer[name] * inner.get(name, torch.ones_like(outer[name])) for name in outer}
    state = {k: v.clone() for k, v in model.state_dict().items()}

    plain = _logits(model, x)
    with hp.masked(model, outer):
        outer_only = _logits(model, x)
    with hp.masked(model, product):
        one_mask = _logits(model, x)
    reference = _logits(_scaled_copy(model, product), x)
    _assert_differs(outer_only, plain, "outer mask")
    _assert_differs(one_mask, outer_only, "inner mask")

    with hp.masked(model, outer):
        with hp.masked(model, inner):
            nested = _logits(model, x)
            assert len(active_masks(model)) == 2
        after_inner = _logits(model, x)
        assert len(active_masks(model)) == 1
        assert all(torch.equal(active_masks(model)[0][k], outer[k]) for k in outer)
    after_outer = _logits(model, x)

    _assert_close(nested, one_mask, 1e-6, "nested vs one product mask")
    _assert_close(nested, reference, 1e-5, "nested vs scaled-weight reference")
    assert torch.equal(after_inner, outer_only)
    assert torch.equal(after_outer, plain)
    assert not hp.is_masked(model) and active_masks(model) == []
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # masks never touch weights


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_head_mask_composes_with_a_batched_mask(family):
    model = build(family)
    x = inputs(family, batch=3)
    outer, _ = _masks(model, "float")
    g = torch.Generator().manual_seed(5)
    batched = {s.name: torch.rand(3, s.num_heads, generator=g) for s in hp.find_sites(model)}
    name0 = hp.find_sites(model)[0].name
    batched[name0][1, 0] = 0.0
    with hp.masked(model, outer), hp.masked(model, batched):
        got = _logits(model, x)
    assert not hp.is_masked(model)
    for i in range(3):  # row i ran with outer * batched[i]: one [H] mask, one example, scaled weights
        row = {k: v[i : i + 1] for k, v in x.items()}
        ref = _scaled_copy(model, {n: outer[n] * batched[n][i] for n in outer})
        _assert_close(got[i : i + 1], _logits(ref, row), 1e-5, f"row {i}")


def test_batched_masks_of_different_batch_sizes_raise():
    model = build("bert")
    x = inputs("bert", batch=3)
    three = hp.ones_mask(model, 3)
    two = hp.ones_mask(model, 2)
    plain = _logits(model, x)
    with hp.masked(model, three):
        with pytest.raises(hp.MaskError, match="batch"):
            with hp.masked(model, two):
                pass
        assert len(active_masks(model)) == 1
        assert all(torch.equal(active_masks(model)[0][k], three[k]) for k in three)
        assert torch.equal(_logits(model, x), plain)  # the failed block left the stack as it was
        with hp.masked(model, hp.ones_mask(model, 3)):  # same batch size: fine
            assert torch.equal(_logits(model, x), plain)
    assert not hp.is_masked(model)


def _own_losses(family: str, logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Per-example loss computed by hand: cross-entropy of the label, or for a causal LM the mean
    next-token cross-entropy over the labelled tokens."""
    if family not in CAUSAL:
        return F.cross_entropy(logits, batch["labels"], reduction="none")
    lg, lb = logits[:, :-1], batch["labels"][:, 1:]
    tok = F.cross_entropy(lg.transpose(1, 2), lb, reduction="none", ignore_index=-100)  # [B, T-1]
    keep = lb != -100
    return (tok * keep).sum(-1) / keep.sum(-1)


def _user_mask(model) -> dict[str, torch.Tensor]:
    s0, s1 = hp.find_sites(model)
    u0, u1 = torch.ones(s0.num_heads), torch.ones(s1.num_heads)
    u0[1], u0[3] = 0.0, 0.6  # one head off, one scaled
    u1[0] = 0.0
    return {s0.name: u0, s1.name: u1}


@pytest.mark.parametrize("family", ["bert", "gpt2"])  # not Llama: its RMSNorm computes in float32 even in a
def test_scoring_inside_a_users_block(family):  # float64 model, which drowns finite differences in rounding
    model = build(family).double()  # float64: finite differences are then accurate to ~1e-8
    # Causal LMs unpadded: a left-padded row's pad queries see no key, and in float64 transformers gives
    # such rows NaN (Llama) or a softmax whose forward rounds the scores away (a gradient FD cannot see).
    batch = inputs(family, batch=4, pad=family not in CAUSAL)
    batch["labels"] = labels(family, batch)
    x = {k: v for k, v in batch.items() if k != "labels"}
    user = _user_mask(model)

    # Finite differences of the hand-computed loss on scaled weights: d L_b / d xi_h at xi = 1, where
    # the model computes with user * xi, i.e. user_h * (1 +- eps) on head h.
    eps = 1e-4
    fd = {}
    for s in hp.find_sites(model):
        fd[s.name] = torch.zeros(4, s.num_heads, dtype=torch.float64)
        for h in range(s.num_heads):
            losses = []
            for sign in (1.0, -1.0):
                scaled = {n: u.double().clone() for n, u in user.items()}
                scaled[s.name][h] *= 1.0 + sign * eps
                losses.append(_own_losses(family, _logits(_scaled_copy(model, scaled), x), batch))
            fd[s.name][:, h] = (losses[0] - losses[1]) / (2 * eps)

    with hp.masked(model, user):
        before = _logits(model, x)
        scores = hp.head_importance(model, [batch], normalize=None)
        grads, valid = hp.mask_gradients(model, batch)
        after = _logits(model, x)
        stack = active_masks(model)
        assert len(stack) == 1 and stack[0].keys() == user.keys()
        assert all(torch.equal(stack[0][k], user[k]) for k in user)
        assert torch.equal(before, after)
    assert not hp.is_masked(model)
    assert all(p.requires_grad for p in model.parameters()) and all(p.grad is None for p in model.parameters())

    assert bool(valid.all())
    for name, u in user.items():
        off = u == 0
        assert torch.equal(grads[name][:, off], torch.zeros_like(grads[name][:, off])), name
        assert bool((scores[name][off] == 0).all()), name
        assert bool((scores[name][~off] > 0).all()), name
        want = fd[name]
        _assert_close(grads[name].double(), want, 1e-5, f"{name} per-example gradients vs finite differences")
        _assert_close(scores[name].double(), want.abs().mean(0), 1e-5, f"{name} I_h vs finite differences")


def test_scoring_error_inside_a_users_block_keeps_the_users_mask():
    model = build("bert")
    x = inputs("bert")
    user = _user_mask(model)
    with hp.masked(model, user):
        before = _logits(model, x)
        with pytest.raises(hp.ConfigError, match="labels"):
            hp.head_importance(model, [x])  # no labels: fails after installing its own mask
        assert len(active_masks(model)) == 1
        assert torch.equal(_logits(model, x), before)
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_mask_heads_inside_a_block_replaces_the_stack(family):
    model = build(family)
    x = inputs(family)
    outer, inner = _masks(model, "binary")
    replacement, _ = _masks(model, "float")
    plain = _logits(model, x)
    with hp.masked(model, replacement):
        replacement_only = _logits(model, x)
    _assert_differs(replacement_only, plain, "replacement mask")

    with hp.masked(model, outer):
        with hp.masked(model, inner):
            hp.mask_heads(model, replacement)
            assert len(active_masks(model)) == 1
            assert torch.equal(_logits(model, x), replacement_only)
        assert len(active_masks(model)) == 1  # the inner block's exit does not bring `outer` back
        assert torch.equal(_logits(model, x), replacement_only)
    # mask_heads lasts until unmask_heads: the outer block's exit neither resurrects nor removes it
    assert hp.is_masked(model) and len(active_masks(model)) == 1
    assert torch.equal(_logits(model, x), replacement_only)
    hp.unmask_heads(model)
    assert torch.equal(_logits(model, x), plain)

    with hp.masked(model, outer):  # unmask_heads inside a block: leaving it applies nothing again
        hp.unmask_heads(model)
        assert torch.equal(_logits(model, x), plain)
    assert not hp.is_masked(model) and torch.equal(_logits(model, x), plain)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_exception_in_a_nested_block_restores_the_outer_mask(family):
    model = build(family)
    x = inputs(family)
    outer, inner = _masks(model, "binary")
    plain = _logits(model, x)
    with hp.masked(model, outer):
        outer_only = _logits(model, x)
    _assert_differs(outer_only, plain, "outer mask")

    class Boom(Exception):
        pass

    with hp.masked(model, outer):
        with pytest.raises(Boom):
            with hp.masked(model, inner):
                model(**x)
                raise Boom
        assert len(active_masks(model)) == 1
        assert torch.equal(_logits(model, x), outer_only)
    assert torch.equal(_logits(model, x), plain)

    with pytest.raises(Boom), hp.masked(model, outer), hp.masked(model, inner):
        raise Boom
    assert not hp.is_masked(model) and torch.equal(_logits(model, x), plain)
