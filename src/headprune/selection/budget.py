"""Budgets: which heads to keep under a head-count or FLOP budget.

Prices come from the one FLOP counter (:func:`headprune.core.cost.head_costs`): FLOPs of one
example's forward at ``seq_len`` tokens (``tgt_len`` decoder tokens for encoder-decoders), a
key/value head paid once while any query head that reads it is kept.

Selection is global across sites and kinds: the ``keep`` share / ``n_keep`` count of heads with the
highest scores, or under a FLOP budget a greedy knapsack by score per marginal FLOP (a query head
whose key/value head is not paid yet also pays for it). ``min_per_site`` heads (the best of each
site) are kept first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..checks import check_int, check_share
from ..core.cost import HeadCosts
from ..core.surgery import DroppedHeads
from ..errors import ConfigError
from .lowest import lowest_heads


def select_heads(
    scores: Mapping[str, torch.Tensor],
    *,
    keep: float | None = None,
    n_keep: int | None = None,
    flops: float | None = None,
    costs: HeadCosts | Mapping[str, torch.Tensor] | None = None,
    min_per_site: int = 0,
    sites: list[str] | None = None,
) -> DroppedHeads:
    """Heads to drop ({site: sorted indices}) so that the kept ones fit one budget.

    Exactly one of: ``keep`` (share of the pool's heads kept, rounded to a count), ``n_keep``
    (count kept) or ``flops`` (share of the pool's head FLOPs kept; ``costs`` from :func:`head_costs`,
    or plain {site: [H]} per-head costs): the kept cost is <= the budget and no dropped head would
    still fit. Higher scores are kept first; ties break by site order then head index. ``sites``
    restricts the pool (heads outside it are kept and not counted).
    """
    if sum(x is not None for x in (keep, n_keep, flops)) != 1:
        raise ConfigError(f"give exactly one budget: keep= (share of heads), n_keep= (number of heads) or flops= "
                          f"(share of head FLOPs); got keep={keep}, n_keep={n_keep}, flops={flops}")
    if sites is not None and (unknown := [s for s in sites if s not in scores]):
        raise ConfigError(f"sites: unknown {unknown}; allowed: {', '.join(scores)}")
    check_int("min_per_site", min_per_site, 0)
    pool = {k: torch.as_tensor(v, dtype=torch.float64).flatten() for k, v in scores.items()
            if sites is None or k in sites}
    total = sum(v.numel() for v in pool.values())
    floor = sum(min(min_per_site, v.numel()) for v in pool.values())  # heads min_per_site forces us to keep
    if keep is not None:
        check_share("keep", keep)
        n_keep = int(round(keep * total))
    if n_keep is not None:
        if isinstance(n_keep, bool) or not isinstance(n_keep, int) or not 0 <= n_keep <= total:
            raise ConfigError(f"n_keep={n_keep!r}; allowed: an integer 0..{total}")
        if n_keep < floor:
            raise ConfigError(f"n_keep={n_keep} is below what min_per_site={min_per_site} keeps ({floor} heads); "
                              f"allowed: n_keep >= {floor} or a smaller min_per_site")
        return lowest_heads(pool, n_heads=total - n_keep, min_per_site=min_per_site)
    check_share("flops", flops)
    return _knapsack(pool, _costs(costs, pool), flops, min_per_site)


def _costs(costs, pool: dict[str, torch.Tensor]) -> HeadCosts:
    if costs is None:
        raise ConfigError("flops= needs costs= (FLOPs per head, from headprune.core.cost.head_costs(model))")
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
    kept: dict[str, set[int]] = {name: set() for name in pool}
    for name, s in pool.items():
        kept[name].update(sorted(range(s.numel()), key=lambda h: (-_score(s[h]), h))[:min_per_site])
    spent = costs.cost(kept)
    if spent > budget + slack:
        raise ConfigError(f"flops={share}: the {min_per_site} heads per site that min_per_site keeps already cost "
                          f"{spent / total if total else 0.0:.1%} of the head FLOPs; allowed: a larger flops share "
                          "or a smaller min_per_site")
    paid = {name: {costs.group[name][h] for h in heads} for name, heads in kept.items()}
    own = {name: c.tolist() for name, c in costs.head.items()}
    score = {name: [_score(x) for x in s] for name, s in pool.items()}
    left = [(i, name, h) for i, (name, s) in enumerate(pool.items()) for h in range(s.numel()) if h not in kept[name]]
    while left:  # the best head per marginal FLOP that still fits; prices drop once a key/value head is paid
        best, best_key = None, None
        for item in left:
            _, name, h = item
            price = own[name][h] + (0.0 if costs.group[name][h] in paid[name] else costs.kv[name])
            if spent + price > budget + slack:
                continue
            key = (-_ratio(score[name][h], price), item[0], h)
            if best_key is None or key < best_key:
                best, best_key = (item, price), key
        if best is None:  # nothing left fits
            break
        (i, name, h), price = best
        kept[name].add(h)
        paid[name].add(costs.group[name][h])
        spent += price
        left.remove((i, name, h))
    drop = {name: sorted(set(range(s.numel())) - kept[name]) for name, s in pool.items()}
    return {k: v for k, v in drop.items() if v}


def _score(x: torch.Tensor) -> float:
    v = float(x)
    return -math.inf if math.isnan(v) else v


def _ratio(s: float, cost: float) -> float:
    if cost == 0:
        return math.inf if s >= 0 else -math.inf
    return s / cost
