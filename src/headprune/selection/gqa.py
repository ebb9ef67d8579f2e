"""Selection that knows grouped-query attention: which heads to drop without growing the KV cache.

Under GQA several query heads read one key/value head. Surgery keeps a key/value head while any of
its query heads stays, and when the kept query heads are spread unevenly over the key/value groups
(7 query heads over 2 key/value heads) it repeats key/value heads, and the cache holds each copy
(:mod:`headprune.core.model.kvcache`). Three modes:

- ``uniform`` (default): the same number of query heads kept in every key/value group of a site, so
  no key/value head is repeated and the cache never grows. A step drops, in every group of one site,
  its lowest-scoring remaining head; steps are taken across sites by the lowest mean score of the
  heads they drop (per unit of cost for FLOP budgets), so the total may fall short of a head count
  by less than one step.
- ``groups``: whole key/value groups with all their query heads (the group's score: the sum of its
  heads' scores; groups compared by the mean over their heads), the only way to shrink the cache.
- ``free``: the heads with the lowest scores wherever they are (the paper's choice); a
  :class:`~headprune.errors.KVCacheWarning` names how much the cache grows when it does.

Sites without GQA (one query head per key/value head) are selected head by head in every mode. A
budget in KV-cache bytes (``kv``) always drops whole groups, the unit that frees cache.
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ..checks import check_share
from ..core.cut.surgery import DroppedHeads
from ..core.model.cost import HeadCosts
from ..core.model.kvcache import cached_kv_heads
from ..core.model.sites import find_sites, kv_of_heads
from ..errors import ConfigError, KVCacheWarning
from .budget import budget_heads
from .budgets import GQA_MODES, Budget, HeadRule, check_budget
from .counts import exactly_kept
from .lowest import lowest_heads

__all__ = ["GQA_MODES", "Groups", "kv_groups", "select_gqa", "kv_growth", "warn_kv_growth", "gqa_steps"]
Groups = Mapping[str, Sequence[int]]  # {site: [H] key/value head each query head reads}


def kv_groups(model: nn.Module) -> dict[str, list[int]]:
    """{site: the key/value head each of its query heads reads} (``list(range(H))`` without GQA)."""
    return {s.name: kv_of_heads(s) for s in find_sites(model)}


def select_gqa(
    scores: Mapping[str, torch.Tensor],
    groups: Groups | None,
    budget: Budget,
    rule: HeadRule = HeadRule(),
    costs: HeadCosts | Mapping[str, float] | None = None,
) -> DroppedHeads:
    """Heads to drop ({site: sorted indices}), lowest scores first, under ``budget`` and ``rule``.

    ``budget`` (:class:`~headprune.selection.budgets.Budget`): ``n_drop`` / ``fraction`` (heads dropped: at
    most that many of the pool), ``keep`` (share of the pool's heads kept: at least that many), ``n_keep``
    (exactly that many heads kept, or a refusal naming the nearest counts the GQA mode can keep), ``flops``
    (share of the pool's head FLOPs kept; ``costs``: :class:`HeadCosts` from
    :func:`headprune.core.model.cost.head_costs`), ``kv`` (share of the pool's KV-cache bytes per token kept;
    ``costs``: {site: bytes per token of one cached key/value head} from
    :func:`headprune.core.model.kvcache.kv_head_bytes`). ``groups``: {site: [H] key/value head of each query head}
    (:func:`kv_groups`; None: no GQA). ``rule``: the GQA mode, ``min_per_site``, the ``sites`` of the pool and
    ``same_per_site`` (every site of the pool keeps the same number of heads, steps taken in all sites at once
    by their summed scores, so a stock config can describe the pruned model, :mod:`headprune.core.store.stock`;
    needs a head-count budget and sites of one shape).
    """
    check_budget(budget, "count", "flops", "kv")
    if not isinstance(rule, HeadRule):
        raise ConfigError(f"rule={rule!r}; allowed: a HeadRule")
    mode, min_per_site = rule.gqa, rule.min_per_site
    if rule.same_per_site and budget.price != "count":
        raise ConfigError(f"same_per_site=True needs a head-count budget; got {budget.keyword}={budget.amount!r}")
    if rule.sites is not None and (unknown := [s for s in rule.sites if s not in scores]):
        raise ConfigError(f"sites: unknown {unknown}; allowed: {', '.join(scores)}")
    pool = {k: torch.as_tensor(v, dtype=torch.float64).flatten() for k, v in scores.items()
            if rule.sites is None or k in rule.sites}
    groups = _check_groups(groups, pool)
    if budget.price == "kv":
        return _by_kv(pool, groups, budget.amount, costs, min_per_site)
    if budget.price == "flops":
        if mode == "free":
            drop = budget_heads(pool, budget, costs, min_per_site=min_per_site)
            warn_kv_growth(drop, groups)
            return drop
        return _by_flops(pool, groups, mode, budget.amount, costs, min_per_site)
    n = budget.count_removed(sum(v.numel() for v in pool.values()))
    n_keep = int(budget.amount) if budget.keyword == "n_keep" else None  # exactly that many kept, or a refusal
    if rule.same_per_site:
        drop = _same_per_site(pool, groups, mode, n, min_per_site)
        return drop if n_keep is None else exactly_kept(drop, pool, groups, (mode, _units(pool, groups, mode)), n_keep,
                                                        min_per_site, same=True)
    if mode == "free":
        drop = lowest_heads(pool, n_heads=n, min_per_site=min_per_site)
        drop = drop if n_keep is None else exactly_kept(drop, pool, groups, None, n_keep, min_per_site)
        warn_kv_growth(drop, groups)
        return drop
    drop = _greedy(pool, _units(pool, groups, mode), lambda unit, spent: spent + len(unit[1]) <= n,
                   lambda unit: len(unit[1]), min_per_site)
    return drop if n_keep is None else exactly_kept(drop, pool, groups, (mode, _units(pool, groups, mode)), n_keep,
                                                    min_per_site)


def kv_growth(drop: Mapping[str, Sequence[int]], groups: Groups) -> tuple[float, str | None, float, int, int]:
    """(whole-pool factor, worst site, its factor, its heads cached after, before) of the KV cache (in key/value
    heads) when ``drop`` is removed; factors > 1 mean a larger cache."""
    before = after = 0
    worst, worst_factor, worst_after, worst_before = None, 1.0, 0, 0
    for name, g in groups.items():
        dropped = set(drop.get(name, []))
        b = cached_kv_heads(g, range(len(g)))
        a = cached_kv_heads(g, [h for h in range(len(g)) if h not in dropped])
        before, after = before + b, after + a
        if b and a / b > worst_factor:
            worst, worst_factor, worst_after, worst_before = name, a / b, a, b
    return (after / before if before else 1.0), worst, worst_factor, worst_after, worst_before


def warn_kv_growth(drop: Mapping[str, Sequence[int]], groups: Groups) -> float:
    """Warn (:class:`KVCacheWarning`) when ``drop`` grows the KV cache of any site; returns the whole factor."""
    factor, worst, worst_factor, after, before = kv_growth(drop, groups)
    if worst is not None:
        warnings.warn(f"gqa='free': query heads removed unevenly across key/value groups make the KV cache "
                      f"{factor:.2f}x the unpruned one ({worst}: {worst_factor:.2f}x, {after} key/value heads cached "
                      f"instead of {before}); gqa='uniform' or 'groups' never enlarge it", KVCacheWarning, stacklevel=3)
    return factor


def _check_groups(groups: Groups | None, pool: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    out = {}
    for name, s in pool.items():
        g = list(range(s.numel())) if groups is None or name not in groups else [int(x) for x in groups[name]]
        if len(g) != s.numel():
            raise ConfigError(f"groups[{name!r}] has {len(g)} entries; allowed: one key/value head per query head "
                              f"({s.numel()})")
        out[name] = g
    return out


def _units(pool: dict[str, torch.Tensor], groups: dict[str, list[int]], mode: str) -> dict[str, list[list[int]]]:
    """{site: steps in the order they must be taken, each the heads it drops}."""
    out = {}
    for name, s in pool.items():
        value = [_value(x) for x in s.tolist()]
        members: dict[int, list[int]] = {}
        for h, j in enumerate(groups[name]):
            members.setdefault(j, []).append(h)
        for j in members:  # lowest score first (NaN last), then head index
            members[j].sort(key=lambda h: (value[h], h))
        if mode == "groups" or all(len(hs) == 1 for hs in members.values()):  # (no GQA: head by head)
            out[name] = sorted(members.values(), key=lambda hs: (sum(value[h] for h in hs) / len(hs), hs[0]))
        else:  # uniform: step k takes every group from keeping (size - k) heads to (size - k - 1)
            size = max(len(hs) for hs in members.values())
            out[name] = [[hs[len(hs) - level - 1] for hs in members.values() if len(hs) > level]
                         for level in range(size - 1, -1, -1)]
            out[name] = [u for u in out[name] if u]
    return out


def gqa_steps(scores: Mapping[str, torch.Tensor], prices: Mapping[str, torch.Tensor], groups: Groups, mode: str,
              kv: Mapping[str, float] | None = None):
    """Head units of a one-budget search (:func:`.units.select_units`) under ``mode`` (``uniform`` or ``groups``):
    ({site: step scores [S]}, {site: step prices [S]}, {site: steps, each the heads it drops, in drop order}).

    A step's score and price are the sums over its heads. With ``kv`` ({site: price of one key/value head},
    shared out evenly in ``prices``), a step is priced as surgery removes it: its query heads' own part, plus
    every key/value head whose group it empties. Under ``uniform`` a site's steps must go in order, so its
    score per price is made non-decreasing along that order (a running maximum, which a ranking by score per
    price then respects); whole groups (``groups``) go in any order.
    """
    pool = {k: torch.as_tensor(v, dtype=torch.float64).flatten() for k, v in scores.items()}
    checked = _check_groups(groups, pool)
    units = _units(pool, checked, mode)
    out_s, out_p = {}, {}
    for site, steps in units.items():
        price = torch.as_tensor(prices[site], dtype=torch.float64).flatten()
        if kv is not None and site in kv:
            g = checked[site]
            n_groups = len(set(g))
            own = price - kv[site] * n_groups / price.numel()  # the key/value share taken out of every head
            left = {x: g.count(x) for x in set(g)}
            p_list = []
            for hs in steps:
                emptied = 0
                for h in hs:
                    left[g[h]] -= 1
                    emptied += left[g[h]] == 0
                p_list.append(own[hs].sum() + kv[site] * emptied)
            p = torch.stack(p_list)
        else:
            p = torch.stack([price[hs].sum() for hs in steps])
        s = torch.stack([pool[site][hs].sum() for hs in steps])
        if mode == "uniform":
            s = torch.cummax(s / p, 0).values * p
        out_s[site], out_p[site] = s, p
    return out_s, out_p, units


def _greedy(pool, units, fits, size, min_per_site) -> dict[str, list[int]]:
    """Take steps lowest mean score first while ``fits(step, spent)``; a site whose next step does not fit
    (or would leave fewer than ``min_per_site`` heads) takes no more."""
    nxt = {name: 0 for name in pool}
    left = {name: s.numel() for name, s in pool.items()}
    order = {name: i for i, name in enumerate(pool)}
    drop: dict[str, list[int]] = {}
    spent = 0.0
    while True:
        open_ = [(name, units[name][nxt[name]]) for name in pool if nxt[name] < len(units[name])]
        if not open_:
            break
        name, heads = min(open_, key=lambda t: (_mean(pool[t[0]], t[1]), order[t[0]]))
        if left[name] - len(heads) < min(min_per_site, pool[name].numel()) or not fits((name, heads), spent):
            nxt[name] = len(units[name])  # closed
            continue
        drop.setdefault(name, []).extend(heads)
        left[name] -= len(heads)
        spent += size((name, heads))
        nxt[name] += 1
    return {name: sorted(v) for name, v in drop.items()}


def _same_per_site(pool, groups, mode, n, min_per_site) -> dict[str, list[int]]:
    """One step = the next step of every site at once, lowest summed score first (sites of one shape)."""
    shapes = {tuple(sorted(_count(g).values())) for g in groups.values()}
    if len(shapes) > 1:
        raise ConfigError(f"same_per_site=True: the sites have different head layouts {sorted(shapes)}; allowed: "
                          "sites of one shape (e.g. sites=[one kind])")
    units = _units(pool, groups, mode)
    merged = {"all": torch.cat([pool[name] for name in pool])}
    offsets, start = {}, 0
    for name in pool:
        offsets[name], start = start, start + pool[name].numel()
    steps = [[offsets[name] + h for name in pool for h in units[name][k]] for k in range(len(units[next(iter(pool))]))]
    per_site = min(min_per_site, min(s.numel() for s in pool.values())) * len(pool)
    drop = _greedy(merged, {"all": steps}, lambda unit, spent: spent + len(unit[1]) <= n, lambda unit: len(unit[1]),
                   per_site)
    out: dict[str, list[int]] = {}
    for i in drop.get("all", []):
        name = next(name for name in reversed(list(pool)) if offsets[name] <= i)
        out.setdefault(name, []).append(i - offsets[name])
    return {name: sorted(v) for name, v in out.items()}


def _count(g: Sequence[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for j in g:
        counts[j] = counts.get(j, 0) + 1
    return counts


def _by_flops(pool, groups, mode, share, costs, min_per_site) -> dict[str, list[int]]:
    """Drop steps, lowest score per FLOP saved first, until the kept FLOPs fit ``share`` of the pool's.

    A step's key (its summed score per FLOP it saves, then the site's order) depends on its own site only,
    so a heap holds each site's next step and only the site that took a step is priced again: a step saves
    its heads' own FLOPs and those of every key/value head whose last reader it drops."""
    check_share("flops", share)
    if not isinstance(costs, HeadCosts):
        raise ConfigError(f"flops= needs costs=HeadCosts (FLOPs per head, from headprune.core.model.cost.head_costs(model)); "
                          f"got {type(costs).__name__}")
    names = list(pool)
    site_cost = [costs.cost({name: range(pool[name].numel())}) for name in names]
    budget = share * sum(site_cost)
    units = _units(pool, groups, mode)
    own = {name: costs.head[name].tolist() for name in names}
    value = {name: [_value(x) for x in pool[name].tolist()] for name in names}
    readers = {name: _count(costs.group[name]) for name in names}  # key/value head -> query heads kept that read it
    left = {name: pool[name].numel() for name in names}
    drop: dict[str, list[int]] = {}
    nxt = {name: 0 for name in pool}
    heap: list[tuple] = []

    def saving(name: str, heads: list[int]) -> float:
        gone = _count([costs.group[name][h] for h in heads])
        closed = sum(1 for j, n in gone.items() if readers[name][j] == n)
        return sum(own[name][h] for h in heads) + costs.kv[name] * closed

    def push(i: int) -> None:  # site i's next step, unless it has none or it would break min_per_site
        name = names[i]
        if nxt[name] >= len(units[name]):
            return
        heads = units[name][nxt[name]]
        if left[name] - len(heads) < min(min_per_site, pool[name].numel()):
            return
        saved = saving(name, heads)
        ratio = float(sum(value[name][h] for h in heads)) / saved if saved > 0 else math.inf
        heapq.heappush(heap, (ratio, i, saved))

    for i in range(len(names)):
        push(i)
    total = sum(site_cost)
    while total > budget * (1 + 1e-12):
        if not heap:
            raise ConfigError(f"flops={share}: min_per_site={min_per_site} keeps more than that; allowed: a larger "
                              "flops= or a smaller min_per_site=")
        _, i, saved = heapq.heappop(heap)
        name = names[i]
        heads = units[name][nxt[name]]
        drop.setdefault(name, []).extend(heads)
        for h in heads:
            readers[name][costs.group[name][h]] -= 1
        left[name] -= len(heads)
        total -= saved
        nxt[name] += 1
        push(i)
    return {name: sorted(v) for name, v in drop.items() if v}


def _by_kv(pool, groups, share, kv_bytes, min_per_site) -> dict[str, list[int]]:
    """Drop whole key/value groups, lowest mean score first, until the cache kept fits ``share`` of the pool's."""
    check_share("kv", share)
    if not isinstance(kv_bytes, Mapping):
        raise ConfigError("kv= needs costs= {site: bytes per token of one cached key/value head} (from "
                          f"headprune.core.model.kvcache.kv_head_bytes(model)); got {type(kv_bytes).__name__}")
    price = {name: float(kv_bytes.get(name, 0.0)) for name in pool}

    def cache(drop) -> float:
        gone = {name: set(heads) for name, heads in drop.items()}
        return sum(price[name] * cached_kv_heads(g, [h for h in range(len(g)) if h not in gone.get(name, ())])
                   for name, g in groups.items())

    total = cache({})
    cached = {name: p for name, p in price.items() if p > 0}  # sites that cache nothing are not touched
    units = _units({k: pool[k] for k in cached}, {k: groups[k] for k in cached}, "groups")
    nxt = {name: 0 for name in cached}
    order = {name: i for i, name in enumerate(cached)}
    drop: dict[str, list[int]] = {}
    while cache(drop) > share * total * (1 + 1e-12):
        open_ = [(name, units[name][nxt[name]]) for name in cached if nxt[name] < len(units[name])
                 and pool[name].numel() - len(drop.get(name, [])) - len(units[name][nxt[name]])
                 >= min(min_per_site, pool[name].numel())]
        if not open_:
            raise ConfigError(f"kv={share}: min_per_site={min_per_site} keeps more cache than that; allowed: a larger "
                              "kv= or a smaller min_per_site=")
        name, heads = min(open_, key=lambda t: (_mean(pool[t[0]], t[1]) / price[t[0]], order[t[0]]))
        drop[name] = drop.get(name, []) + heads
        nxt[name] += 1
    return {name: sorted(v) for name, v in drop.items() if v}


def _value(x) -> float:
    v = float(x)
    return math.inf if math.isnan(v) else v


def _mean(s: torch.Tensor, heads: Sequence[int]) -> float:
    return sum(_value(s[h]) for h in heads) / len(heads)
