"""Scores -> which heads to drop. Plain tensors in, a plain plan ({site: head indices}) out."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..errors import ConfigError


def lowest_heads(
    scores: Mapping[str, torch.Tensor],
    *,
    n_heads: int | None = None,
    fraction: float | None = None,
    min_per_site: int = 0,
    sites: list[str] | None = None,
) -> dict[str, list[int]]:
    """The ``n_heads`` (or ``fraction`` of all) heads with the lowest scores, globally across sites.

    ``sites`` restricts the choice (e.g. one attention kind); ``min_per_site`` keeps at least that
    many heads in every site. Ties break by site order then head index, so the result is
    deterministic. Returns {site: sorted head indices to drop} (sites with nothing to drop omitted).
    """
    pool = {k: v for k, v in scores.items() if sites is None or k in sites}
    if sites is not None and (unknown := [s for s in sites if s not in scores]):
        raise ConfigError(f"sites: unknown {unknown}; allowed: {', '.join(scores)}")
    total = sum(v.numel() for v in pool.values())
    if (n_heads is None) == (fraction is None):
        raise ConfigError("give exactly one of n_heads= or fraction=")
    if fraction is not None:
        if not 0.0 <= fraction <= 1.0:
            raise ConfigError(f"fraction={fraction}; allowed: 0.0..1.0")
        n_heads = int(round(fraction * total))
    if not isinstance(n_heads, int) or not 0 <= n_heads <= total:
        raise ConfigError(f"n_heads={n_heads!r}; allowed: 0..{total}")
    if min_per_site < 0:
        raise ConfigError(f"min_per_site={min_per_site}; allowed: >= 0")
    order = sorted(((float(s[h]), i, h, name) for i, (name, s) in enumerate(pool.items()) for h in range(s.numel())),
                   key=lambda t: (_nan_last(t[0]), t[1], t[2]))
    left = {name: s.numel() for name, s in pool.items()}
    drop: dict[str, list[int]] = {}
    for _, _, h, name in order:
        if n_heads == 0:
            break
        if left[name] <= min_per_site:
            continue
        drop.setdefault(name, []).append(h)
        left[name] -= 1
        n_heads -= 1
    return {name: sorted(v) for name, v in drop.items()}


def _nan_last(x: float) -> float:
    return math.inf if math.isnan(x) else x
