"""``n_keep`` exactly: the head counts a GQA mode can keep, and a refusal naming the nearest when asked another.

Uniform grouped-query attention drops one query head from every key/value group of a site at a time, ``groups``
whole groups, ``same_per_site`` the same count in every site, and ``min_per_site`` keeps a floor per site: not
every count is reachable. :func:`exactly_kept` returns a selection that keeps exactly ``n_keep`` heads, or
refuses (typed, one line) with the nearest counts below and above that can be kept.
"""

from __future__ import annotations

import torch

from ..core.cut.surgery import DroppedHeads
from ..errors import ConfigError


def exactly_kept(drop: DroppedHeads, pool: dict[str, torch.Tensor], groups: dict[str, list[int]],
                 steps: tuple[str, dict[str, list[list[int]]]] | None, n_keep: int, min_per_site: int, *,
                 same: bool = False) -> DroppedHeads:
    """``drop`` when it keeps exactly ``n_keep`` heads; else a refusal naming the nearest counts ``mode`` can keep
    (uniform GQA takes one query head from every key/value group at a time, ``groups`` whole groups; ``same``:
    every site keeps the same number, same_per_site). ``steps``: (mode, {site: the heads each step drops, in
    order}) from :func:`.gqa.select_gqa`; None: gqa='free', one head at a time."""
    kept = sum(s.numel() for s in pool.values()) - sum(len(v) for v in drop.values())
    if kept == n_keep:
        return drop
    mode, units = steps if steps is not None else ("free", {k: [[h] for h in range(v.numel())] for k, v in pool.items()})
    feasible = {0}
    for name, site_steps in units.items():
        floor = min(min_per_site, pool[name].numel())
        options, left = [0], pool[name].numel()
        for step in site_steps:
            if left - len(step) < floor:
                break
            left -= len(step)
            options.append(pool[name].numel() - left)
        feasible = {a + pool[name].numel() - b for a in feasible for b in options}
        if same:  # sites of one layout, stepped together
            feasible = {len(pool) * (pool[name].numel() - b) for b in options}
            break
    below = max((k for k in feasible if k < n_keep), default=None)
    above = min((k for k in feasible if k > n_keep), default=None)
    near = " or ".join(str(k) for k in (below, above) if k is not None)
    gqa = any(len(set(groups[name])) < len(groups[name]) for name in pool)  # query heads sharing a key/value head
    why = [f"the lowest-score steps keep {kept}" if n_keep in feasible else
           "gqa='uniform' keeps the same number of query heads in every key/value group" if gqa and mode == "uniform"
           else "gqa='groups' drops whole key/value groups" if gqa and mode == "groups" else ""]
    why += [f"same_per_site=True keeps the same number in each of the {len(pool)} sites"] if same else []
    why += [f"min_per_site={min_per_site} keeps at least {min(feasible)}"] if min_per_site else []
    other = ", or gqa='free'" if gqa and mode != "free" and not same else \
        ", or a smaller min_per_site=" if min_per_site else ""
    raise ConfigError(f"n_keep={n_keep}: cannot keep exactly {n_keep} heads ({', and '.join(w for w in why if w)}); "
                      f"allowed: {near} (the nearest counts that can be kept){other}")
