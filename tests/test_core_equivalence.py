"""The two stages held equal: physically pruned output == masked output, on every family."""

from __future__ import annotations

import random
import zlib

import pytest
import torch

import headprune as hp
from tiny import CAUSAL, FAMILIES, SEQ2SEQ, build, inputs

N_PLANS = 20


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def random_plans(sites, n: int, seed: int) -> list[dict[str, list[int]]]:
    """n plans: plan 0 empties the first site; for GQA, plan 1 drops whole KV groups and plan 2 not."""
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        plan = {s.name: sorted(rng.sample(range(s.num_heads), rng.randint(0, s.num_heads))) for s in sites}
        if i == 0:
            plan[sites[0].name] = list(range(sites[0].num_heads))
        gqa = [s for s in sites if s.num_kv_heads < s.num_heads]
        if gqa and i in (1, 2):
            for s in gqa:
                g = s.num_heads // s.num_kv_heads
                if i == 1:  # whole KV groups: every query head of KV head 0
                    plan[s.name] = list(range(g))
                else:  # one query head of each group: groups stay, but uneven if g > 2 ... or even
                    plan[s.name] = [j * g for j in range(s.num_kv_heads - 1)]
        plans.append(plan)
    return plans


def removed_params(model, plan) -> int:
    """q/k/v/o slices (weights and biases) the plan removes, counted from the unpruned shapes."""
    total = 0
    for s in hp.find_sites(model):
        drop = set(plan.get(s.name, []))
        if not drop:
            continue
        hd, g = s.head_dim, s.num_heads // s.num_kv_heads
        q_mod, o_mod = s.q.module, s.o
        d_in = q_mod.weight.shape[0] if hp.core.model.sites.is_conv1d(q_mod) else q_mod.weight.shape[1]
        has_bias = getattr(q_mod, "bias", None) is not None
        per_q = hd * d_in + (hd if has_bias else 0)
        per_o = hd * hp.core.model.sites.out_features(o_mod)
        gone_kv = sum(1 for j in range(s.num_kv_heads) if all(h in drop for h in range(j * g, (j + 1) * g)))
        total += len(drop) * (per_q + per_o) + 2 * gone_kv * per_q  # the output bias stays
    return total


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_pruned_equals_masked_random_plans(family, attn):
    x = inputs(family)
    reference = build(family, attn=attn)
    sites = hp.find_sites(reference)
    n_plans = N_PLANS if attn == "eager" else 4
    for plan in random_plans(sites, n_plans, seed=zlib.crc32(family.encode())):
        model = build(family, attn=attn)
        with torch.no_grad(), hp.masked(model, hp.mask_from_heads(model, plan)):
            want = model(**x).logits
        before = _params(model)
        expected_drop = removed_params(model, plan)
        hp.prune_heads(model, plan)
        with torch.no_grad():
            got = model(**x).logits
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), plan
        assert before - _params(model) == expected_drop, plan
        kept = hp.kept_heads(model)
        for s in sites:
            assert kept[s.name] == [h for h in range(s.num_heads) if h not in plan[s.name]]


@pytest.mark.parametrize("family", sorted(CAUSAL | SEQ2SEQ))
def test_generate_identical_after_pruning(family):
    model = build(family)
    sites = hp.find_sites(model)
    for i, plan in enumerate(random_plans(sites, 4, seed=7)):
        model = build(family)
        x = inputs(family, batch=2, pad=family not in CAUSAL)
        x.pop("decoder_input_ids", None)
        kw = dict(max_new_tokens=8, do_sample=False, min_new_tokens=8, num_beams=2 if i == 3 else 1)
        with torch.no_grad(), hp.masked(model, hp.mask_from_heads(model, plan)):
            want = model.generate(**x, **kw)
        hp.prune_heads(model, plan)
        with torch.no_grad():
            got = model.generate(**x, **kw)
        assert torch.equal(got, want), plan


def test_all_ones_mask_is_bit_identical():
    for family in FAMILIES:
        model = build(family)
        x = inputs(family)
        with torch.no_grad():
            plain = model(**x).logits
            with hp.masked(model, hp.ones_mask(model)):
                ones = model(**x).logits
        assert torch.equal(plain, ones), family
        assert not hp.is_masked(model)


def test_all_heads_masked_gives_output_bias_only():
    model = build("bart")
    site = hp.find_sites(model)[0]
    captured = {}
    handle = site.attention.register_forward_hook(lambda m, a, out: captured.update(out=out[0]))
    with torch.no_grad(), hp.masked(model, {site.name: torch.zeros(site.num_heads)}):
        model(**inputs("bart"))
    handle.remove()
    expected = site.o.bias.expand_as(captured["out"])
    assert torch.equal(captured["out"], expected)


def test_t5_first_layer_pruned_keeps_later_layers_bias_rows():
    """T5's layer 0 computes the relative-position bias that later layers reuse (transformers #19625)."""
    for plan in ({"encoder.0.self": [0, 1, 2, 3]}, {"encoder.0.self": [1, 3], "encoder.1.self": [0]},
                 {"decoder.0.self": [0, 1, 2, 3], "decoder.1.self": [2], "decoder.0.cross": [1]}):
        model = build("t5")
        x = inputs("t5")
        with torch.no_grad(), hp.masked(model, hp.mask_from_heads(model, plan)):
            want = model(**x).logits
        hp.prune_heads(model, plan)
        with torch.no_grad():
            got = model(**x).logits
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())


def test_pruning_twice_composes_and_indices_refer_to_current_heads():
    for family in ("bert", "llama", "t5", "gpt2"):
        model = build(family)
        x = inputs(family)
        name = hp.find_sites(model)[1].name
        n = hp.find_sites(model)[1].num_heads
        hp.prune_heads(model, {name: [0]})  # original head 0 goes; current head 0 is original 1
        assert hp.kept_heads(model)[name] == list(range(1, n))
        hp.prune_heads(model, {name: [0]})
        assert hp.kept_heads(model)[name] == list(range(2, n))
        fresh = build(family)
        with torch.no_grad(), hp.masked(fresh, hp.mask_from_heads(fresh, {name: [0, 1]})):
            want = fresh(**x).logits
        with torch.no_grad():
            got = model(**x).logits
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), family


def test_gqa_uneven_plan_keeps_groups_and_repeats_without_copying():
    model = build("llama")  # 6 query heads, 2 kv heads: groups of 3
    hp.prune_heads(model, {"decoder.0.self": [0], "decoder.1.self": [0, 1, 2]})
    s0, s1 = hp.find_sites(model)
    assert (s0.num_heads, s0.num_kv_heads) == (5, 2)  # kept per kv head: 2 and 3 -> groups of 1
    assert isinstance(s0.k.module, hp.core.model.runtime.RepeatHeads)
    assert s0.k.module.base.out_features == 2 * s0.head_dim
    assert (s1.num_heads, s1.num_kv_heads) == (3, 1)  # a whole KV group went: plain GQA remains
    assert isinstance(s1.k.module, torch.nn.Linear)
    assert s1.attention.num_key_value_groups == 3
