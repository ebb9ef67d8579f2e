"""Widths the kernels like: one budget over heads and FFN neurons in whole blocks (issue 37).

llama.cpp quantises a weight in blocks of 32 (Q4_0, Q8_0) or 256 (K-quants) along its input dimension,
and GPU tensor cores work in tiles of 64 or 128: a pruned FFN width (the input of ``down``) or attention
width (heads x head_dim, the input of the output projection) that is not a multiple of the block leaves a
tensor that a quantiser stores in a wider type, or a kernel pads. With ``multiple_of = N`` every width the
selection changes is a multiple of N (a site or FFN it leaves whole keeps its own width).

How: each site's or FFN's units are put in drop order (FFN neurons and heads without grouped-query
attention: lowest score per price first; GQA steps of :func:`.gqa.gqa_steps`: in their order, priced as
surgery removes them), then consecutive units are grouped into **blocks** so that after every block the
width left is a multiple of N (the first block takes the remainder, e.g. 9 heads of 64 with N = 128 drop
1 head, then 2 at a time; a last block may empty the site). A block's score and price are the sums of its
units'. Blocks are kept in reverse drop order only (a suffix), and their score per price is made
non-decreasing along the drop order (a running maximum, as for GQA steps), so ranking by score per price
respects the order. The search keeps the best blocks by score per price while they fit in ``share`` x the
pool's price; a group whose next block does not fit is closed; others go on filling. Where every block has
one price this is exact (top-k); otherwise it is the greedy knapsack, within one block's score of the best
choice (``tests/test_selection_aligned.py`` checks both against brute force).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..checks import check_choice, check_int
from ..core.model.unit_cost import UnitCosts
from ..errors import ConfigError
from .budgets import Budget, HeadRule
from .gqa import gqa_steps
from .units import pool_heads, share_kept


@dataclass
class _Group:
    """One site or FFN: its blocks in drop order (each a list of unit indices), their scores and prices."""

    kind: str  # heads | neurons
    name: str
    blocks: list[list[int]]
    ratio: torch.Tensor  # [B] float64: score per price, made non-decreasing along the drop order
    price: torch.Tensor  # [B]
    forced: int = 0  # blocks at the end (of the drop order) always kept: min_per_site


def aligned_blocks(sizes: Sequence[int], total: int, multiple: int) -> list[list[int]]:
    """Consecutive steps (indices into ``sizes``, units each drops, in drop order) grouped so that after every
    group the units left, ``total`` minus those dropped so far, are a multiple of ``multiple``."""
    check_int("multiple", multiple, 1)
    if sum(sizes) != total:
        raise ConfigError(f"steps of {sum(sizes)} units for {total} units; allowed: steps that add up to the total")
    out, current, left = [], [], total
    for i, size in enumerate(sizes):
        current.append(i)
        left -= size
        if left % multiple == 0:
            out.append(current)
            current = []
    return out


@dataclass(frozen=True)
class Widths:
    """Widths the kernels like: every width a selection changes a multiple of ``multiple_of``."""

    multiple_of: int  # the block: 32 (Q4_0, Q8_0), 256 (K-quants), 64 / 128 (tensor-core tiles)
    head_dims: Mapping[str, int]  # {site: head_dim}: an attention width is heads x head_dim

    def __post_init__(self) -> None:
        check_int("multiple_of", self.multiple_of, 1)
        for site, d in self.head_dims.items():
            check_int(f"head_dims[{site!r}]", d, 1)


def select_aligned(head_scores: Mapping[str, torch.Tensor], neuron_scores: Mapping[str, torch.Tensor],
                   costs: UnitCosts, budget: Budget, widths: Widths, *, groups: Mapping[str, list[int]] | None = None,
                   units: str = "both", rule: HeadRule = HeadRule()
                   ) -> tuple[dict[str, list[int]], dict[str, list[int]], dict]:
    """(heads to drop {site: indices}, neurons to drop {ffn: indices}, summary), as
    :func:`.units.select_units`, with every changed FFN width and attention width (heads x
    ``widths.head_dims[site]``) a multiple of ``widths.multiple_of``."""
    share = share_kept(budget)
    if not isinstance(widths, Widths):
        raise ConfigError(f"widths={widths!r}; allowed: Widths(multiple_of, head_dims)")
    check_choice("units", units, ("heads", "neurons", "both"))
    head_scores = pool_heads(head_scores, rule)
    multiple_of, min_per_site = widths.multiple_of, rule.min_per_site
    pool: list[_Group] = []
    if units != "neurons":
        pool += _head_groups(head_scores, costs, widths, groups, rule)
    if units != "heads":
        for name, sc in neuron_scores.items():
            if name not in costs.neurons:
                raise ConfigError(f"neurons: no price for {name!r}")
            order = _drop_order(sc, costs.neurons[name])
            pool.append(_group("neurons", name, [[i] for i in order], _flat(sc)[order], _flat(costs.neurons[name])[order],
                               multiple_of))
    if not pool:
        raise ConfigError(f"units={units!r}: the model has no units of that kind to prune")
    total = sum(float(g.price.sum()) for g in pool)
    kept = _search(pool, share * total)
    drop: dict[str, dict[str, list[int]]] = {"heads": {}, "neurons": {}}
    for g, k in zip(pool, kept, strict=True):
        drop[g.kind][g.name] = sorted(u for b in g.blocks[: len(g.blocks) - k] for u in b)
    spent = sum(float(g.price[len(g.blocks) - k:].sum()) for g, k in zip(pool, kept, strict=True))
    of = {kind: sum(len(u) for g in pool if g.kind == kind for u in g.blocks) for kind in ("heads", "neurons")}
    summary = {"units": units, "share": share, "multiple_of": multiple_of, "price_kept": spent, "price_total": total,
               "kept": {k: n - sum(len(v) for v in drop[k].values()) for k, n in of.items() if n},
               "of": {k: n for k, n in of.items() if n}, "min_per_site": min_per_site,
               "blocks": sum(len(g.blocks) for g in pool), "blocks_kept": sum(kept)}
    return drop["heads"], drop["neurons"], summary


def _head_groups(scores, costs: UnitCosts, widths: Widths, groups, rule: HeadRule):
    head_dims, multiple_of, gqa, min_per_site = widths.head_dims, widths.multiple_of, rule.gqa, rule.min_per_site
    if groups is not None and gqa != "free" and scores:
        step_scores, step_prices, steps = gqa_steps(scores, costs.heads, groups, gqa, kv=costs.kv)
    else:
        step_scores, step_prices, steps = scores, costs.heads, None
    out = []
    for name, sc in step_scores.items():
        if name not in head_dims or name not in costs.heads:
            raise ConfigError(f"heads: no head_dim or no price for site {name!r}")
        per_head = multiple_of // math.gcd(multiple_of, int(head_dims[name]))  # heads per block of width N
        if steps is not None and gqa == "uniform":
            order = list(range(len(steps[name])))  # GQA steps go in their own order
        else:
            order = _drop_order(sc, step_prices[name])
        units = [list(steps[name][i]) if steps is not None else [i] for i in order]
        g = _group("heads", name, units, _flat(sc)[order], _flat(step_prices[name])[order], per_head)
        need = min(min_per_site, sum(len(u) for u in units))
        left, forced = 0, 0
        while left < need:
            forced += 1
            left += len(g.blocks[-forced])
        g.forced = forced
        out.append(g)
    return out


def _flat(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64).flatten()


def _drop_order(scores, prices) -> list[int]:
    """Units by score per price, lowest (dropped first) first; ties by index."""
    sc, pr = _flat(scores), _flat(prices)
    if sc.shape != pr.shape or not bool(torch.isfinite(sc).all()) or bool((pr <= 0).any()):
        raise ConfigError(f"scores {tuple(sc.shape)} and prices {tuple(pr.shape)} must match, be finite, prices > 0")
    return torch.argsort(sc / pr, stable=True).tolist()


def _group(kind: str, name: str, units: list[list[int]], scores, prices, multiple: int) -> _Group:
    """Blocks of ``units`` (steps in drop order, each the unit indices it drops; ``scores`` / ``prices`` one per
    step, in that order) with the width left after each block a multiple of ``multiple``."""
    sc = torch.as_tensor(scores, dtype=torch.float64).flatten()
    pr = torch.as_tensor(prices, dtype=torch.float64).flatten()
    blocks = aligned_blocks([len(u) for u in units], sum(len(u) for u in units), multiple)
    s = torch.stack([sc[b].sum() for b in blocks])
    p = torch.stack([pr[b].sum() for b in blocks])
    ratio = torch.cummax(s / p, 0).values  # score per price non-decreasing along the drop order
    return _Group(kind, name, [[x for i in b for x in units[i]] for b in blocks], ratio, p)


def _search(pool: list[_Group], budget: float) -> list[int]:
    """Blocks kept per group (a suffix of its drop order): forced ones first, then best score per price while
    they fit; a group whose next block does not fit takes no more."""
    kept = [g.forced for g in pool]
    spent = sum(float(g.price[len(g.blocks) - g.forced:].sum()) for g in pool)
    if spent > budget * (1 + 1e-12):
        raise ConfigError(f"min_per_site keeps {spent / max(budget, 1e-300):.3g} x the budget; allowed: a larger share "
                          "or a smaller min_per_site")
    # candidates: (score per price, position from the end, group, block), best first; later blocks first on ties
    cands = sorted(((float(g.ratio[b]), len(g.blocks) - b, gi, b) for gi, g in enumerate(pool)
                    for b in range(len(g.blocks) - g.forced)), key=lambda c: (-c[0], c[1], c[2]))
    closed = set()
    for _, _, gi, b in cands:
        g = pool[gi]
        if gi in closed or b != len(g.blocks) - 1 - kept[gi]:  # only the next block of its group
            continue
        if spent + float(g.price[b]) <= budget * (1 + 1e-12):
            kept[gi] += 1
            spent += float(g.price[b])
        else:
            closed.add(gi)
    return kept
