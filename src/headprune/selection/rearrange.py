"""Mask rearrangement (Kwon et al. 2022, 4.2): per site, swap kept and dropped heads to lower the
second-order loss estimate ``1/2 (1 - m)^T F (1 - m)`` with the site's Fisher block ``F`` [H, H].

Scores of single heads ignore that two heads may do the same job (dropping both hurts more than the
sum) or cancel out (dropping both hurts less). With ``x = 1 - m`` the indicator of the dropped set S,
``x^T F x = sum_{i, j in S} F_ij`` sees those pairs. The number of heads dropped per site stays as
the budget chose it; only which ones changes. Under grouped-query attention a swap may change how
many key/value heads stay in use; given ``groups`` (the key/value head of each query head), swaps
that would raise that number are not made, so a FLOP budget stays met exactly.

Two greedy stages, each of which can only lower the objective: Kwon et al.'s pass (take each kept
head in increasing Fisher order into S, then drop from S the head whose removal leaves the lowest
objective — possibly the one just taken), then best-improvement single swaps until none helps.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import ConfigError
from ..scoring.fisher import Fisher, quadratic


def rearrange(drop: Mapping[str, list[int]], fisher: Fisher, *, groups: Mapping[str, list[int]] | None = None,
              max_swaps: int = 1000, within_groups: bool = False) -> dict[str, list[int]]:
    """The plan ``drop`` ({site: heads dropped}) with each site's set improved; counts per site unchanged.

    ``groups``: {site: key/value head of each query head} (``HeadCosts.group``) to keep the number
    of key/value heads in use from growing (a FLOP budget), or None. ``within_groups``: swap only heads
    of the same key/value group, so the number kept per group stays (GQA modes ``uniform``, ``groups``).
    """
    out = {}
    for name, heads in drop.items():
        if name not in fisher.blocks:
            raise ConfigError(f"drop: site {name!r} has no Fisher block; allowed: {', '.join(fisher.blocks)}")
        out[name] = rearrange_site(fisher.blocks[name], heads, groups=None if groups is None else groups[name],
                                   max_swaps=max_swaps, within_groups=within_groups)
    return out


def rearrange_site(block: torch.Tensor, dropped: list[int], *, groups: list[int] | None = None,
                   max_swaps: int = 1000, within_groups: bool = False) -> list[int]:
    """Improved dropped set of one site (same size), never with a higher ``quadratic(block, .)`` nor,
    with ``groups``, more key/value heads in use."""
    block = torch.as_tensor(block, dtype=torch.float64)
    n = block.shape[0]
    if block.shape != (n, n):
        raise ConfigError(f"block has shape {tuple(block.shape)}; allowed: a square [heads, heads] matrix")
    chosen = sorted(set(int(h) for h in dropped))
    if any(not 0 <= h < n for h in chosen):
        raise ConfigError(f"dropped heads {chosen}; allowed: indices 0..{n - 1}")
    if groups is not None and len(groups) != n:
        raise ConfigError(f"groups has {len(groups)} entries; allowed: one per head ({n})")
    if not chosen or len(chosen) == n:
        return chosen
    group = torch.as_tensor(list(range(n)) if groups is None else list(groups), dtype=torch.long)
    chosen = _kwon_pass(block, chosen, group, within_groups)
    return _swap_search(block, chosen, group, max_swaps, within_groups)


def _allowed(group: torch.Tensor, x: torch.Tensor, within: bool = False) -> torch.Tensor:
    """[d, k] bool: may dropped head d and kept head k trade places without a key/value head more in use
    (``within``: only inside one key/value group)?"""
    kept = (x == 0).double()
    count = torch.zeros(int(group.max()) + 1, dtype=torch.float64).index_add_(0, group, kept)[group]  # [H]
    opens = count == 0  # d's key/value head is unused now
    closes = count == 1  # k is the last kept head of its key/value head
    same = group[:, None] == group[None, :]
    return same if within else same | ~opens[:, None] | closes[None, :]


def _kwon_pass(block: torch.Tensor, chosen: list[int], group: torch.Tensor, within: bool = False) -> list[int]:
    n = block.shape[0]
    diag = block.diagonal()
    others = sorted((h for h in range(n) if h not in chosen), key=lambda h: (float(diag[h]), h))
    current = list(chosen)
    for h in others:
        if h in current:
            continue
        trial = current + [h]
        idx = torch.tensor(trial)
        sub = block.index_select(0, idx).index_select(1, idx)  # [k+1, k+1]
        total, row = sub.sum(), sub.sum(1)
        # objective without member r: total - 2 * row_r + F_rr; the last entry (h itself) restores `current`
        without = total - 2 * row + sub.diagonal()
        x = torch.zeros(n, dtype=torch.float64)
        x[current] = 1.0
        ok = torch.cat([_allowed(group, x, within)[idx[:-1], h], torch.tensor([True])])  # r back in, h out
        without = torch.where(ok, without, torch.full_like(without, float("inf")))
        best = int(torch.argmin(without))
        if best != len(current) and float(without[best]) < float(without[-1]):
            current = trial[:best] + trial[best + 1:]
    return sorted(current)


def _swap_search(block: torch.Tensor, chosen: list[int], group: torch.Tensor, max_swaps: int,
                 within: bool = False) -> list[int]:
    n = block.shape[0]
    x = torch.zeros(n, dtype=torch.float64)
    x[chosen] = 1.0
    diag = block.diagonal()
    tol = 1e-12 * float(block.abs().max().clamp_min(1e-300))
    for _ in range(max_swaps):
        u = block @ x  # [H]
        # swap d (dropped -> kept) with k (kept -> dropped): change 2(u_k - u_d) + F_kk + F_dd - 2 F_kd
        change = 2 * (u[None, :] - u[:, None]) + diag[None, :] + diag[:, None] - 2 * block  # [d, k]
        valid = (x[:, None] == 1) & (x[None, :] == 0) & _allowed(group, x, within)
        change = torch.where(valid, change, torch.full_like(change, float("inf")))
        flat = int(torch.argmin(change))
        if not float(change.flatten()[flat]) < -tol:
            break
        d, k = divmod(flat, n)
        x[d], x[k] = 0.0, 1.0
    return sorted(int(h) for h in torch.nonzero(x).flatten())


__all__ = ["rearrange", "rearrange_site", "quadratic"]
