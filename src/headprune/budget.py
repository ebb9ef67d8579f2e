"""Budgets: what each head costs, and which heads to keep under a head or FLOP budget.

Prices are FLOPs of one example's forward (2 per multiply-add, as :func:`headprune.bench.flop_breakdown`
counts them), from one forward at ``seq_len`` tokens (``tgt_len`` decoder tokens for
encoder-decoders), so cross-attention and decoder heads are priced at their own lengths. A query
head costs its rows of the query projection, its columns of the output projection and its two
attention products ``QK^T`` and ``AV``; a key/value head costs its rows of the key and value
projections and is paid once while any query head that reads it is kept (surgery removes it with
its last query head; without grouped-query attention every head is its own key/value head). The
prices add up exactly: a pruned model's attention FLOPs are :meth:`HeadCosts.cost` of what it keeps.

Selection is global across sites and kinds: the ``keep`` share / ``n_keep`` count of heads with the
highest scores, or under a FLOP budget a greedy knapsack by score per marginal FLOP (a query head
whose key/value head is not paid yet also pays for it). ``min_per_site`` heads (the best of each
site) are kept first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .errors import ConfigError
from .selection import lowest_heads
from .sites import find_sites, is_conv1d
from .surgery import _kv_of_heads


@dataclass
class HeadCosts:
    """FLOPs per example: ``head`` {site: [H]} of each query head's own work, ``kv`` {site: FLOPs of one
    key/value head}, ``group`` {site: [H] key/value head each query head reads}."""

    head: dict[str, torch.Tensor]
    kv: dict[str, float]
    group: dict[str, list[int]]

    @classmethod
    def additive(cls, costs: Mapping[str, torch.Tensor]) -> HeadCosts:
        """Plain per-head costs (no shared key/value heads)."""
        head = {k: torch.as_tensor(v, dtype=torch.float64).flatten() for k, v in costs.items()}
        return cls(head, {k: 0.0 for k in head}, {k: list(range(v.numel())) for k, v in head.items()})

    def cost(self, kept: Mapping[str, Iterable[int]]) -> float:
        """Attention FLOPs of keeping ``kept`` ({site: heads}; sites left out keep nothing)."""
        total = 0.0
        for name, heads in kept.items():
            heads = set(int(h) for h in heads)
            total += float(self.head[name][sorted(heads)].sum()) + self.kv[name] * len({self.group[name][h] for h in heads})
        return total

    def total(self) -> float:
        return self.cost({name: range(h.numel()) for name, h in self.head.items()})

    def per_head(self) -> dict[str, torch.Tensor]:
        """Each head's price with the key/value heads shared out evenly (an estimate under GQA)."""
        return {name: h + self.kv[name] * len(set(self.group[name])) / h.numel() for name, h in self.head.items()}


def head_costs(model: nn.Module, seq_len: int = 128, *, tgt_len: int | None = None) -> HeadCosts:
    """The attention FLOPs of every head of ``model`` as it is now (see the module doc)."""
    from .bench import example_inputs

    sites = find_sites(model)
    rows: dict[int, int] = {}

    def count(module, args, _out):
        rows[id(module)] = rows.get(id(module), 0) + args[0].numel() // _in_features(module)

    mods = {id(m): m for s in sites for m in (_linear(s.q.module), _linear(s.k.module), _linear(s.o))}
    handles = [m.register_forward_hook(count) for m in mods.values()]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(**example_inputs(model, 1, seq_len, tgt_len=tgt_len))
    except (IndexError, RuntimeError, ValueError) as e:
        raise ConfigError(f"seq_len={seq_len}, tgt_len={tgt_len}: the model cannot run one example of this "
                          f"length: {e}") from None
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    head, kv, group = {}, {}, {}
    for s in sites:
        q, k, o = _linear(s.q.module), _linear(s.k.module), _linear(s.o)
        t_q, t_k, t_o = rows.get(id(q), 0), rows.get(id(k), 0), rows.get(id(o), 0)
        hd = s.head_dim
        macs = t_q * _in_features(q) * hd + t_o * hd * _out_features(o) + 2 * hd * t_q * t_k
        head[s.name] = torch.full((s.num_heads,), 2.0 * macs, dtype=torch.float64)
        kv[s.name] = 2.0 * 2 * t_k * _in_features(k) * hd  # key and value rows of one key/value head
        group[s.name] = _kv_of_heads(s)
    return HeadCosts(head, kv, group)


def _linear(module: nn.Module) -> nn.Module:
    return getattr(module, "base", module)  # RepeatHeads computes with its base Linear


def _in_features(module: nn.Module) -> int:
    return module.weight.shape[0] if is_conv1d(module) else module.weight.shape[1]


def _out_features(module: nn.Module) -> int:
    return module.weight.shape[1] if is_conv1d(module) else module.weight.shape[0]


def select_heads(
    scores: Mapping[str, torch.Tensor],
    *,
    keep: float | None = None,
    n_keep: int | None = None,
    flops: float | None = None,
    costs: HeadCosts | Mapping[str, torch.Tensor] | None = None,
    min_per_site: int = 0,
    sites: list[str] | None = None,
) -> dict[str, list[int]]:
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
    if isinstance(min_per_site, bool) or not isinstance(min_per_site, int) or min_per_site < 0:
        raise ConfigError(f"min_per_site={min_per_site!r}; allowed: an integer >= 0")
    pool = {k: torch.as_tensor(v, dtype=torch.float64).flatten() for k, v in scores.items()
            if sites is None or k in sites}
    total = sum(v.numel() for v in pool.values())
    floor = sum(min(min_per_site, v.numel()) for v in pool.values())  # heads min_per_site forces us to keep
    if keep is not None:
        _share("keep", keep)
        n_keep = int(round(keep * total))
    if n_keep is not None:
        if isinstance(n_keep, bool) or not isinstance(n_keep, int) or not 0 <= n_keep <= total:
            raise ConfigError(f"n_keep={n_keep!r}; allowed: an integer 0..{total}")
        if n_keep < floor:
            raise ConfigError(f"n_keep={n_keep} is below what min_per_site={min_per_site} keeps ({floor} heads); "
                              f"allowed: n_keep >= {floor} or a smaller min_per_site")
        return lowest_heads(pool, n_heads=total - n_keep, min_per_site=min_per_site)
    _share("flops", flops)
    return _knapsack(pool, _costs(costs, pool), flops, min_per_site)


def _share(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name}={value!r}; allowed: a number 0.0..1.0")


def _costs(costs, pool: dict[str, torch.Tensor]) -> HeadCosts:
    if costs is None:
        raise ConfigError("flops= needs costs= (FLOPs per head, from headprune.budget.head_costs(model))")
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
