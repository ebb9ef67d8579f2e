"""One budget over heads and FFN neurons (Kwon et al. 2022, 4.2 "mask search", generalised).

Every unit (a head of a site, a neuron of an FFN) has a score (the diagonal Fisher of its mask: to
second order, dropping a set of units raises the loss by half the sum of their scores) and a price
(FLOPs at a sequence length, parameters or measured seconds: :mod:`headprune.core.model.unit_cost`). We
keep the units that maximise the summed score of what is kept under ``share`` x the pool's total
price.

Kwon et al. (all heads one price, all neurons another) keep, for every number ``h`` of heads, the
``h`` best heads and as many of the best neurons as the rest of the budget pays for, and take the
``h`` with the highest kept score. Here prices may differ between sites (an encoder-decoder's
cross-attention heads, a decoder's FFN), so heads and neurons are each ranked by score per price
(which is Kwon et al.'s order when prices are equal, and ranks each site's or FFN's own units by
score: every layer keeps its top-k) and ``h`` is enumerated the same way; budget left over is then
filled greedily with any unit that still fits. This is exact for one unit type of one price and an
approximation otherwise (a knapsack; the greedy gap is at most one unit's score per type).
Interactions between units (off-diagonal Fisher) are ignored, as in Kwon et al.'s search.

Grouped-query attention (``groups``, ``gqa``; see :mod:`.gqa`): under ``uniform`` (the default) a head
unit of a GQA site is one *step* — one head from every key/value group, lowest first — so the kept
heads stay even over the groups and the KV cache never grows; steps of a site must go in order, so
their score per price is made non-decreasing along that order (a running maximum) and a site keeps
its last steps. Under ``groups`` a unit is a whole key/value group; under ``free`` single heads (a
:class:`~headprune.errors.KVCacheWarning` names the cache growth).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..checks import check_choice
from ..core.model.unit_cost import UnitCosts
from ..errors import ConfigError
from .budgets import Budget, HeadRule
from .gqa import gqa_steps, warn_kv_growth

UNITS = ("heads", "neurons", "both")


def select_units(
    head_scores: Mapping[str, torch.Tensor],
    neuron_scores: Mapping[str, torch.Tensor],
    costs: UnitCosts,
    budget: Budget,
    *,
    groups: Mapping[str, list[int]] | None = None,
    units: str = "both",
    rule: HeadRule = HeadRule(),
) -> tuple[dict[str, list[int]], dict[str, list[int]], dict]:
    """(heads to drop {site: indices}, neurons to drop {ffn: indices}, summary) keeping at most ``budget`` (a
    share kept: ``Budget.of(share=...)``) of the pool's price. ``units``: which kinds are in the pool (the
    others are all kept and not counted). ``groups``: {site: the key/value head each query head reads}
    (:func:`.gqa.kv_groups`; None: no GQA). ``rule``: the GQA mode, the head ``sites`` in the pool and
    ``min_per_site``: every site keeps at least this many heads (all it has, if fewer): its best head units
    (under ``uniform``, its last steps) are kept first and paid from the budget; the rest is searched."""
    check_choice("units", units, UNITS)
    share = share_kept(budget)
    head_scores = pool_heads(head_scores, rule)
    gqa, min_per_site = rule.gqa, rule.min_per_site
    head_prices, steps = costs.heads, None
    if groups is not None and gqa != "free" and units != "neurons" and head_scores:
        head_scores, head_prices, steps = gqa_steps(head_scores, costs.heads, groups, gqa, kv=costs.kv)
        # ranked last step first: among equal score per price a site keeps its later steps, so that what is
        # kept is always a suffix of its steps (priced exactly: the last one also removes the key/value heads)
        head_scores = {k: v.flip(0) for k, v in head_scores.items()}
        head_prices = {k: v.flip(0) for k, v in head_prices.items()}
    pools = {"heads": (head_scores, head_prices), "neurons": (neuron_scores, costs.neurons)}
    kinds = ["heads", "neurons"] if units == "both" else [units]
    forced: dict[str, dict[str, set[int]]] = {"heads": {}, "neurons": {}}
    if min_per_site and "heads" in kinds:
        forced["heads"] = _kept_first(head_scores, head_prices, steps, min_per_site)
    ranked, total, forced_price = {}, 0.0, 0.0
    for kind in kinds:
        scores, prices = pools[kind]
        if not scores:
            raise ConfigError(f"units={units!r}: the model has no {kind} to prune")
        ranked[kind] = _ranked(kind, scores, prices, skip=forced[kind])
        total += float(ranked[kind][1].sum())
        for name, idx in forced[kind].items():
            paid = float(torch.as_tensor(prices[name], dtype=torch.float64).flatten()[sorted(idx)].sum()) if idx else 0.0
            total += paid
            forced_price += paid
    budget_left = share * total - forced_price
    if budget_left < -1e-12 * total:
        raise ConfigError(f"min_per_site={min_per_site} keeps {forced_price / total:.3g} of the pool's price, more than "
                          f"share={share}; allowed: a larger share= or a smaller min_per_site=")
    budget_left = max(budget_left, 0.0)
    if "heads" in ranked and "neurons" in ranked:
        keep = _enumerate(ranked["heads"], ranked["neurons"], budget_left)
    else:
        (kind, r), = ranked.items()
        keep = {kind: _prefix(r[1], budget_left)}
    kept_sets = {kind: set(keep[kind]) for kind in ranked}
    spent = sum(float(ranked[k][1][list(v)].sum()) for k, v in kept_sets.items() if v)
    spent = _fill(ranked, kept_sets, forced, steps, spent + forced_price, budget_left + forced_price)
    drops = {kind: _drops(ranked[kind][0], kept_sets[kind]) for kind in ranked}
    if steps is not None:  # steps back to heads: a site that drops d steps drops its first d (its lowest)
        drops["heads"] = {site: sorted(h for step in steps[site][:len(d)] for h in step)
                          for site, d in drops["heads"].items()}
    elif groups is not None and "heads" in drops and gqa == "free":
        warn_kv_growth(drops["heads"], groups)
    n_forced = {k: sum(len(v) for v in forced[k].values()) for k in ranked}
    summary = {"units": units, "share": share, "price_kept": spent, "price_total": total,
               "kept": {k: len(v) + n_forced[k] for k, v in kept_sets.items()},
               "of": {k: len(r[0]) + n_forced[k] for k, r in ranked.items()}, "min_per_site": min_per_site,
               "score_dropped": sum(float(r[2].sum()) - float(r[2][list(kept_sets[k])].sum()) if kept_sets[k] else
                                    float(r[2].sum()) for k, r in ranked.items())}
    if steps is not None:  # counted in heads, not in the steps the search ranked
        summary["of"]["heads"] = sum(len(step) for site_steps in steps.values() for step in site_steps)
        summary["kept"]["heads"] = summary["of"]["heads"] - sum(len(d) for d in drops["heads"].values())
    return drops.get("heads", {}), drops.get("neurons", {}), summary


def share_kept(budget: Budget) -> float:
    """The share of the pool's price ``budget`` keeps (one budget over units is a share kept, not a count)."""
    if not isinstance(budget, Budget) or not budget.is_share or budget.removed:
        raise ConfigError(f"budget={budget!r}; allowed: a share of the pool's price kept, Budget.of(share=...)")
    return float(budget.amount)


def pool_heads(head_scores: Mapping[str, torch.Tensor], rule: HeadRule) -> Mapping[str, torch.Tensor]:
    """The head scores of ``rule.sites`` (all without); ``same_per_site`` refused (a head plan's rule only)."""
    if not isinstance(rule, HeadRule):
        raise ConfigError(f"rule={rule!r}; allowed: a HeadRule")
    if rule.same_per_site:
        raise ConfigError("same_per_site=True: one budget over units keeps no count per site; allowed: False")
    if rule.sites is None:
        return head_scores
    if unknown := [s for s in rule.sites if s not in head_scores]:
        raise ConfigError(f"sites: unknown {unknown}; allowed: {', '.join(head_scores)}")
    return {k: v for k, v in head_scores.items() if k in rule.sites}


def _fill(ranked, kept_sets, forced, steps, spent: float, budget: float) -> float:
    """Fill what the search left with any unit that still fits, best score per price first (a GQA step only
    after the step that follows it in drop order is kept); returns the price spent."""
    for kind, (ids, price, score) in ranked.items():
        position = {unit: j for j, unit in enumerate(ids)}

        def in_order(j: int, kind=kind, ids=ids, position=position) -> bool:  # steps: the later one is kept
            if kind != "heads" or steps is None or ids[j][1] == 0:
                return True
            before = (ids[j][0], ids[j][1] - 1)
            return before[1] in forced[kind].get(before[0], ()) or position.get(before, -1) in kept_sets[kind]

        for i in torch.argsort(score / price.clamp_min(1e-300), descending=True, stable=True).tolist():
            if i not in kept_sets[kind] and spent + float(price[i]) <= budget * (1 + 1e-12) and in_order(i):
                kept_sets[kind].add(i)
                spent += float(price[i])
    return spent


def _kept_first(scores: Mapping[str, torch.Tensor], prices: Mapping[str, torch.Tensor], steps, min_per_site: int):
    """{site: head units kept before the search} so that every site keeps ``min_per_site`` heads: under GQA
    steps, the last steps (a site drops its steps in order); otherwise its best units by score per price."""
    out = {}
    for site, sc in scores.items():
        sc = torch.as_tensor(sc, dtype=torch.float64).flatten()
        if steps is not None:
            sizes = [len(step) for step in steps[site]]  # heads each step drops, in drop order
            left, need, d = sum(sizes), min(min_per_site, sum(sizes)), 0
            while d < len(sizes) and left - sizes[d] >= need:
                left -= sizes[d]
                d += 1
            out[site] = {len(sizes) - 1 - j for j in range(d, len(sizes))}  # steps are ranked last first
        else:
            pr = torch.as_tensor(prices[site], dtype=torch.float64).flatten()
            order = torch.argsort(sc / pr.clamp_min(1e-300), descending=True, stable=True)
            out[site] = set(order[: min(min_per_site, sc.numel())].tolist())
    return out


def _ranked(kind: str, scores: Mapping[str, torch.Tensor], prices: Mapping[str, torch.Tensor],
            skip: Mapping[str, set[int]] | None = None):
    """(ids [(name, index)], price [n], score [n]) of one kind, in ranking order (score per price); the units
    in ``skip`` ({name: indices}, kept before the search) left out."""
    ids, p, s = [], [], []
    skip = skip or {}
    for name, sc in scores.items():
        if name not in prices:
            raise ConfigError(f"{kind}: no price for {name!r}")
        sc = torch.as_tensor(sc, dtype=torch.float64).flatten()
        pr = torch.as_tensor(prices[name], dtype=torch.float64).flatten()
        if sc.shape != pr.shape or not bool(torch.isfinite(sc).all()) or bool((pr <= 0).any()):
            raise ConfigError(f"{kind}[{name!r}]: scores {tuple(sc.shape)} and prices {tuple(pr.shape)} must match, "
                              "be finite, prices > 0")
        free = [i for i in range(sc.numel()) if i not in skip.get(name, ())]
        ids += [(name, i) for i in free]
        p.append(pr[free])
        s.append(sc[free])
    price, score = torch.cat(p), torch.cat(s)
    order = torch.argsort(score / price, descending=True, stable=True)
    return [ids[i] for i in order.tolist()], price[order], score[order]


def _prefix(price: torch.Tensor, budget: float) -> list[int]:
    """The longest prefix of ranked units whose price fits."""
    n = int(torch.searchsorted(torch.cumsum(price, 0), torch.tensor([budget * (1 + 1e-12)], dtype=torch.float64),
                               right=True))
    return list(range(n))


def _enumerate(heads, neurons, budget: float) -> dict[str, list[int]]:
    """Kwon et al.'s search: for each count h of best heads, the best neurons the rest pays for."""
    ch = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(heads[1], 0)])  # [H+1] price of top h
    sh = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(heads[2], 0)])
    cn = torch.cumsum(neurons[1], 0)
    sn = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(neurons[2], 0)])
    fits = ch <= budget * (1 + 1e-12)
    m = torch.searchsorted(cn, (budget - ch).clamp_min(0) * (1 + 1e-12), right=True)  # [H+1] neurons affordable
    value = torch.where(fits, sh + sn[m], torch.full_like(sh, -float("inf")))
    h = int(torch.argmax(value))
    return {"heads": list(range(h)), "neurons": list(range(int(m[h])))}


def _drops(ids: list[tuple[str, int]], kept: set[int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for j, (name, i) in enumerate(ids):
        out.setdefault(name, [])
        if j not in kept:
            out[name].append(i)
    return {name: sorted(v) for name, v in out.items()}
