"""FLOP-budget selection in a heap pass chooses exactly what the straightforward rescanning algorithms chose.

The references below are the algorithms as first written (every remaining head or site rescanned per pick,
the whole plan re-priced per candidate); they share no code with :mod:`headprune.selection` beyond the
price book :class:`HeadCosts`.
"""

import math
import random

import pytest
import torch

from headprune.core.model.cost import HeadCosts
from headprune.errors import ConfigError
from headprune.selection.budget import budget_heads
from headprune.selection.budgets import Budget, HeadRule
from headprune.selection.gqa import select_gqa


def _value(x, nan):
    v = float(x)
    return nan if math.isnan(v) else v


def reference_knapsack(pool, costs: HeadCosts, share, min_per_site):
    """Greedy by score per marginal FLOP: rescan every remaining head per pick."""
    def ratio(s, c):
        return (math.inf if s >= 0 else -math.inf) if c == 0 else s / c

    budget = share * costs.total()
    slack = 1e-9 * max(budget, 1.0)
    kept = {name: set(sorted(range(s.numel()), key=lambda h: (-_value(s[h], -math.inf), h))[:min_per_site])
            for name, s in pool.items()}
    spent = costs.cost(kept)
    if spent > budget + slack:
        return None  # min_per_site alone costs more than the budget
    paid = {name: {costs.group[name][h] for h in heads} for name, heads in kept.items()}
    left = [(i, name, h) for i, (name, s) in enumerate(pool.items()) for h in range(s.numel()) if h not in kept[name]]
    while left:
        best, best_key = None, None
        for i, name, h in left:
            price = float(costs.head[name][h]) + (0.0 if costs.group[name][h] in paid[name] else costs.kv[name])
            if spent + price > budget + slack:
                continue
            key = (-ratio(_value(pool[name][h], -math.inf), price), i, h)
            if best_key is None or key < best_key:
                best, best_key = ((i, name, h), price), key
        if best is None:
            break
        (i, name, h), price = best
        kept[name].add(h)
        paid[name].add(costs.group[name][h])
        spent += price
        left.remove((i, name, h))
    drop = {name: sorted(set(range(s.numel())) - kept[name]) for name, s in pool.items()}
    return {k: v for k, v in drop.items() if v}


def reference_steps(pool, groups, mode):
    out = {}
    for name, s in pool.items():
        members = {}
        for h, j in enumerate(groups[name]):
            members.setdefault(j, []).append(h)
        for j in members:
            members[j].sort(key=lambda h: (_value(s[h], math.inf), h))
        mean = {j: sum(_value(s[h], math.inf) for h in hs) / len(hs) for j, hs in members.items()}
        if mode == "groups" or all(len(hs) == 1 for hs in members.values()):
            out[name] = sorted(members.values(), key=lambda hs: (mean[groups[name][hs[0]]], hs[0]))
        else:
            size = max(len(hs) for hs in members.values())
            out[name] = [u for u in ([hs[len(hs) - level - 1] for hs in members.values() if len(hs) > level]
                                     for level in range(size - 1, -1, -1)) if u]
    return out


def reference_by_flops(pool, groups, mode, share, costs: HeadCosts, min_per_site):
    """Drop steps: every site's next step re-priced on the whole plan, per pick."""
    full = {name: list(range(s.numel())) for name, s in pool.items()}

    def kept(drop):
        gone = {name: set(heads) for name, heads in drop.items()}
        return {name: [h for h in heads if h not in gone.get(name, ())] for name, heads in full.items()}

    budget = share * costs.cost(full)
    units = reference_steps(pool, groups, mode)
    drop, nxt = {}, {name: 0 for name in pool}
    while costs.cost(kept(drop)) > budget * (1 + 1e-12):
        best = None
        for order, name in enumerate(pool):
            if nxt[name] >= len(units[name]):
                continue
            heads = units[name][nxt[name]]
            if len(full[name]) - len(drop.get(name, [])) - len(heads) < min(min_per_site, len(full[name])):
                continue
            trial = dict(drop) | {name: drop.get(name, []) + heads}
            saved = costs.cost(kept(drop)) - costs.cost(kept(trial))
            key = (sum(_value(pool[name][h], math.inf) for h in heads) / saved if saved > 0 else math.inf, order)
            if best is None or key < best[0]:
                best = (key, name, heads)
        if best is None:
            return None
        _, name, heads = best
        drop[name] = drop.get(name, []) + heads
        nxt[name] += 1
    return {name: sorted(v) for name, v in drop.items() if v}


def random_instance(rng: random.Random, gqa: bool):
    n_sites = rng.randint(1, 6)
    pool, head, kv, group = {}, {}, {}, {}
    for i in range(n_sites):
        n_kv = rng.choice([1, 2, 4]) if gqa else None
        per = rng.choice([1, 2, 3]) if gqa else 1
        n = n_kv * per if gqa else rng.randint(1, 9)
        name = f"encoder.{i}.self"
        pool[name] = torch.tensor([rng.random() for _ in range(n)], dtype=torch.float64)
        equal = rng.random() < 0.5  # real models: every head of a site costs the same
        head[name] = torch.tensor([1.0 if equal else rng.uniform(0.5, 2.0) for _ in range(n)], dtype=torch.float64)
        kv[name] = rng.uniform(0.0, 3.0) if gqa else 0.0
        group[name] = [h // per for h in range(n)] if gqa else list(range(n))
    return pool, HeadCosts(head, kv, group)


@pytest.mark.parametrize("gqa", [False, True])
def test_knapsack_matches_rescanning_reference(gqa):
    rng = random.Random(7 + gqa)
    for _ in range(150):
        pool, costs = random_instance(rng, gqa)
        share, floor = rng.choice([0.1, 0.3, 0.5, 0.77, 0.95, 1.0]), rng.choice([0, 0, 1])
        expected = reference_knapsack(pool, costs, share, floor)
        if expected is None:
            with pytest.raises(ConfigError, match="min_per_site"):
                budget_heads(pool, Budget.of(flops=share), costs, min_per_site=floor)
            continue
        assert budget_heads(pool, Budget.of(flops=share), costs, min_per_site=floor) == expected


@pytest.mark.parametrize("mode", ["uniform", "groups"])
def test_gqa_flop_steps_match_rescanning_reference(mode):
    rng = random.Random(11 if mode == "uniform" else 13)
    compared = 0
    for _ in range(150):
        pool, costs = random_instance(rng, gqa=True)
        share, floor = rng.choice([0.1, 0.3, 0.5, 0.77, 1.0]), rng.choice([0, 0, 1, 2])
        expected = reference_by_flops(pool, costs.group, mode, share, costs, floor)
        if expected is None:  # min_per_site keeps more than the budget: both refuse
            with pytest.raises(ConfigError, match="min_per_site"):
                select_gqa(pool, costs.group, Budget.of(flops=share), HeadRule(gqa=mode, min_per_site=floor),
                           costs)
            continue
        got = select_gqa(pool, costs.group, Budget.of(flops=share), HeadRule(gqa=mode, min_per_site=floor),
                         costs)
        assert got == expected
        compared += bool(expected)
    assert compared > 50  # most instances drop something


def test_one_site_without_gqa_drops_lowest_scores_first():
    """A hand-checked case: one site, equal prices, keep half of the FLOPs -> the two lowest heads go."""
    pool = {"encoder.0.self": torch.tensor([0.4, 0.1, 0.9, 0.2], dtype=torch.float64)}
    costs = HeadCosts.additive({"encoder.0.self": torch.ones(4)})
    assert budget_heads(pool, Budget.of(flops=0.5), costs) == {"encoder.0.self": [1, 3]}
    assert select_gqa(pool, None, Budget.of(flops=0.5), HeadRule(), costs) == {"encoder.0.self": [1, 3]}
