"""Heads and neurons under one budget on grouped-query attention: the KV cache never grows by default."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import headprune as hp
from headprune.compression import PruneSettings, compress
from headprune.core.model.unit_cost import unit_costs
from headprune.errors import KVCacheWarning
from headprune.selection.budgets import Budget, HeadRule
from headprune.selection.gqa import kv_groups
from headprune.selection.units import select_units
from tiny import build, inputs, labels


def _cache_bytes(model) -> int:
    """Bytes of the key/value cache a forward with use_cache really holds (the model's own cache object)."""
    x = inputs("llama", batch=2, length=5, pad=False)
    with torch.no_grad():
        out = model(**x, use_cache=True)
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def _kept_per_group(groups: list[int], dropped: list[int]) -> dict[int, int]:
    out = {g: 0 for g in set(groups)}
    for h, g in enumerate(groups):
        if h not in dropped:
            out[g] += 1
    return out


@pytest.mark.parametrize("share", [0.3, 0.5, 0.7])
def test_uniform_units_keep_heads_even_over_key_value_groups(share):
    model = build("llama")
    groups = kv_groups(model)
    gen = torch.Generator().manual_seed(int(share * 10))
    heads = {s: torch.rand(len(g), generator=gen, dtype=torch.float64) for s, g in groups.items()}
    costs = unit_costs(model, "flops", seq_len=16)
    neurons = {k: torch.rand(v.numel(), generator=gen, dtype=torch.float64) for k, v in costs.neurons.items()}
    drop_h, _, _ = select_units(heads, neurons, costs, Budget.of(share=share), units="both", groups=groups)
    assert any(drop_h.values())
    for site, d in drop_h.items():
        counts = set(_kept_per_group(groups[site], d).values())
        assert len(counts) == 1, (site, d)  # the same number kept in every group
        # within each group the lowest-scoring heads went first
        for g in set(groups[site]):
            members = [h for h, x in enumerate(groups[site]) if x == g]
            gone = [h for h in members if h in d]
            kept = [h for h in members if h not in d]
            if gone and kept:
                assert max(float(heads[site][h]) for h in gone) <= min(float(heads[site][h]) for h in kept)


def test_compress_both_on_gqa_never_grows_the_cache_and_free_warns():
    model = build("llama")
    batches = []
    for s in range(3):
        x = inputs("llama", batch=4, seed=s)
        batches.append({**x, "labels": labels("llama", x, seed=s)})
    before = _cache_bytes(model)
    result = compress(model, batches, PruneSettings(units="both", share=0.5, seq_len=12, compensate="none"))
    assert sum(len(v) for v in result.dropped_heads.values()) > 0
    assert _cache_bytes(result.model) <= before
    groups = kv_groups(model)
    costs = unit_costs(model, "flops", seq_len=12)
    scores = {s: torch.tensor([0.0, 0.1, 0.5, 0.2, 0.3, 0.9], dtype=torch.float64) for s in groups}
    for mode in ("free", "uniform", "groups"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            drop, _, _ = select_units(scores, {}, costs, Budget.of(share=0.7), units="heads", groups=groups,
                                      rule=HeadRule(gqa=mode))
        pruned = copy.deepcopy(model)
        hp.prune_heads(pruned, {k: v for k, v in drop.items() if v})
        grew = _cache_bytes(pruned) > before
        assert grew == (mode == "free"), (mode, drop)  # this plan grows the cache only when heads go freely
        assert grew == any(issubclass(w.category, KVCacheWarning) for w in caught)


@pytest.mark.parametrize("gqa", ["uniform", "groups"])
@pytest.mark.parametrize("price", ["params", "flops"])
def test_gqa_steps_are_priced_as_surgery_removes_them(gqa, price):
    """A step that leaves its key/value heads costs only its query heads; the step that empties a group pays
    the key/value head too: the priced removal equals what the pruned model measures (params, or FLOPs)."""
    from headprune.core.model.cost import flop_breakdown
    from headprune.core.prune import prune_neurons

    model = build("llama")
    groups = kv_groups(model)
    costs = unit_costs(model, price, seq_len=16)
    gen = torch.Generator().manual_seed(1)
    heads = {s: torch.rand(len(g), generator=gen, dtype=torch.float64) for s, g in groups.items()}
    neurons = {k: torch.rand(v.numel(), generator=gen, dtype=torch.float64) for k, v in costs.neurons.items()}

    def measure(m):
        return float(sum(p.numel() for p in m.parameters())) if price == "params" else flop_breakdown(m, 16)["total"]

    before = measure(model)
    for share in (0.2, 0.45, 0.8):
        drop_h, drop_n, summary = select_units(heads, neurons, costs, Budget.of(share=share), groups=groups,
                                               rule=HeadRule(gqa=gqa))
        pruned = copy.deepcopy(model)
        hp.prune_heads(pruned, {k: v for k, v in drop_h.items() if v}, verify=False)
        prune_neurons(pruned, {k: v for k, v in drop_n.items() if v})
        removed = before - measure(pruned)
        assert abs(removed - (summary["price_total"] - summary["price_kept"])) <= 1e-9 * before, (share, gqa)
