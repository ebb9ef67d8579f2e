"""Budgets: which heads to keep under a head-count or FLOP budget, head by head (no key/value groups kept even).

Prices come from the one FLOP counter (:func:`headprune.core.model.cost.head_costs`): FLOPs of one
example's forward at ``seq_len`` tokens (``tgt_len`` decoder tokens for encoder-decoders), a
key/value head paid once while any query head that reads it is kept.

Selection is global across sites and kinds: a :class:`~.budgets.Budget` count or share of heads with the
highest scores, or under a FLOP budget a greedy knapsack by score per marginal FLOP (a query head
whose key/value head is not paid yet also pays for it). ``min_per_site`` heads (the best of each
site) are kept first. The knapsack is one heap pass (n log n in the number of heads; 5,120 heads in
``benchmarks/selection_speed.py``). :func:`headprune.selection.select_heads` is the public entry point
(it keeps grouped-query attention's KV cache from growing); this is its rule for ``gqa="free"``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping

import torch

from ..checks import check_int
from ..core.cut.surgery import DroppedHeads
from ..core.model.cost import HeadCosts
from ..errors import ConfigError
from .budgets import Budget, check_budget
from .lowest import lowest_heads


def budget_heads(
    scores: Mapping[str, torch.Tensor],
    budget: Budget,
    costs: HeadCosts | Mapping[str, torch.Tensor] | None = None,
    *,
    min_per_site: int = 0,
) -> DroppedHeads:
    """Heads to drop ({site: sorted indices}) so that the kept ones fit ``budget``.

    A head count (``n_keep``, ``keep``, ``n_drop``, ``fraction``) or ``flops`` (share of the pool's head FLOPs
    kept; ``costs`` from :func:`head_costs`, or plain {site: [H]} per-head costs): the kept cost is <= the
    budget and no dropped head would still fit. Higher scores are kept first; ties break by site order then
    head index. Every site of ``scores`` is in the pool.
    """
    check_budget(budget, "count", "flops")
    check_int("min_per_site", min_per_site, 0)
    pool = {k: torch.as_tensor(v, dtype=torch.float64).flatten() for k, v in scores.items()}
    total = sum(v.numel() for v in pool.values())
    floor = sum(min(min_per_site, v.numel()) for v in pool.values())  # heads min_per_site forces us to keep
    if budget.price == "count":
        n_keep = total - budget.count_removed(total)
        if n_keep < floor:
            raise ConfigError(f"{budget.keyword}={budget.amount!r} keeps {n_keep} heads, below what "
                              f"min_per_site={min_per_site} keeps ({floor} heads); allowed: a budget keeping >= {floor} "
                              "or a smaller min_per_site=")
        return lowest_heads(pool, n_heads=total - n_keep, min_per_site=min_per_site)
    return _knapsack(pool, _costs(costs, pool), budget.amount, min_per_site)


def _costs(costs, pool: dict[str, torch.Tensor]) -> HeadCosts:
    if costs is None:
        raise ConfigError("flops= needs costs= (FLOPs per head, from headprune.core.model.cost.head_costs(model))")
    if not isinstance(costs, HeadCosts):
        if not isinstance(costs, Mapping):
            raise ConfigError(f"costs: {type(costs).__name__}; allowed: HeadCosts or a mapping site -> [heads]")
        costs = HeadCosts.additive({k: v for k, v in costs.items() if k in pool})
    for name, s in pool.items():
        c = costs.head.get(name)
        ok = c is not None and c.shape == s.shape and bool(torch.isfinite(c).all()) and not bool((c < 0).any())
        if not ok or not (math.isfinite(costs.kv.get(name, math.nan)) and costs.kv[name] >= 0):
            raise ConfigError(f"costs[{name!r}] = {c}; allowed: {s.numel()} finite costs >= 0, one per head")
    return HeadCosts({k: costs.head[k] for k in pool}, {k: costs.kv[k] for k in pool},
                     {k: costs.group[k] for k in pool})


def _knapsack(pool, costs: HeadCosts, share: float, min_per_site: int) -> dict[str, list[int]]:
    """Greedy by score per marginal FLOP, after the ``min_per_site`` best heads of every site."""
    total = costs.total()
    budget = share * total
    slack = 1e-9 * max(budget, 1.0)  # float sums in another order must not flip a head that fits exactly
    score = {name: [-math.inf if math.isnan(x) else x for x in s.tolist()] for name, s in pool.items()}
    kept: dict[str, set[int]] = {name: set() for name in pool}
    if min_per_site:
        for name, s in score.items():
            kept[name].update(sorted(range(len(s)), key=lambda h: (-s[h], h))[:min_per_site])
    spent = costs.cost(kept) if min_per_site else 0.0  # (nothing kept yet costs nothing)
    if spent > budget + slack:
        raise ConfigError(f"flops={share}: the {min_per_site} heads per site that min_per_site keeps already cost "
                          f"{spent / total if total else 0.0:.1%} of the head FLOPs; allowed: a larger flops share "
                          "or a smaller min_per_site")
    paid = {name: {costs.group[name][h] for h in heads} for name, heads in kept.items()}
    own = {name: c.tolist() for name, c in costs.head.items()}
    # Candidates (-score per marginal FLOP, site position, head, price), best first; ties: site order, head
    # index. A head's price only falls (once its key/value head is paid) and what is spent only grows, so a
    # head that does not fit at its price now never fits until its key/value head is paid; it is then offered
    # again at the lower price from a heap beside the list sorted once. Each head is offered at most twice.
    names = list(pool)
    waiting: dict[tuple[int, int], list[int]] = {}  # (site position, key/value head) -> heads left that read it
    ranked = []
    for i, name in enumerate(names):
        group, kv, paid_here, own_here, score_here = costs.group[name], costs.kv[name], paid[name], own[name], score[name]
        for h in range(len(own_here)):
            if h not in kept[name]:
                waiting.setdefault((i, group[h]), []).append(h)
                price = own_here[h] + (0.0 if group[h] in paid_here else kv)
                ranked.append((-_ratio(score_here[h], price), i, h, price))
    ranked.sort()
    again: list[tuple] = []  # heads offered again at a lower price
    pos = 0
    while pos < len(ranked) or again:  # the best head per marginal FLOP that still fits
        if again and (pos == len(ranked) or again[0] < ranked[pos]):
            _, i, h, price = heapq.heappop(again)
        else:
            _, i, h, price = ranked[pos]
            pos += 1
        name = names[i]
        group = costs.group[name][h]
        if h in kept[name] or price != own[name][h] + (0.0 if group in paid[name] else costs.kv[name]):
            continue  # taken already, or offered again since: its key/value head is paid now
        if spent + price > budget + slack:
            continue  # does not fit now, nor later at this price
        kept[name].add(h)
        spent += price
        if group not in paid[name]:
            paid[name].add(group)
            if costs.kv[name]:
                for other in waiting[(i, group)]:  # cheaper now: their key/value head is paid
                    if other not in kept[name]:
                        price = own[name][other]
                        heapq.heappush(again, (-_ratio(score[name][other], price), i, other, price))
    drop = {name: sorted(set(range(s.numel())) - kept[name]) for name, s in pool.items()}
    return {k: v for k, v in drop.items() if v}


def _ratio(s: float, cost: float) -> float:
    if cost == 0:
        return math.inf if s >= 0 else -math.inf
    return s / cost
