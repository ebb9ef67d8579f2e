"""Which units of one projection to remove, given how many: greedy removal by the output error left after the
best linear stand-in (the structured Optimal Brain Surgeon error), for ``compensate="obs-seq"``.

A consumer projection ``y = W x + b`` (``W``: ``[d_out, C]``) reads units of ``width`` input columns each (a head's
``head_dim``, a neuron's one). Over the calibration tokens, with the inputs' covariance ``S`` (centred: the bias
takes the mean, as :func:`headprune.core.standins.affine_standin`) ridged to ``H = S + lam I``
(``lam = damping x mean diag S``), removing a set ``Q`` of columns and refitting the kept ones costs

    1/2 tr(W_Q [Hinv_QQ]^-1 W_Q^T),    Hinv = H^-1 over the columns still kept,

and the kept columns move by ``-W_Q [Hinv_QQ]^-1 Hinv_Q,:`` while ``Hinv`` is downdated by the Schur complement
(Hassibi & Stork 1993; Frantar & Alistarh's OBC; the group form SlimGPT uses). :func:`greedy_removal` removes the
unit of least error, updates, and recomputes: heads one at a time, neurons in batches of the lowest errors whose
size shrinks as the count left does. The counts come from the caller (per *pool*: e.g. the query heads of one
key/value group), so the budget and any GQA constraint of the selection are kept; only *which* units changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

Pool = tuple[Sequence[int], int]  # (candidate units, how many of them to remove)


def greedy_removal(weight: torch.Tensor, mean: torch.Tensor, second: torch.Tensor, pools: Sequence[Pool],
                   width: int, damping: float) -> list[int]:
    """The units (sorted) removed from ``weight`` ``[d_out, C]`` (``C = units x width``), ``count`` from each pool's
    candidates, greedily by the OBS error on inputs of ``mean`` ``[C]`` and second moment ``second`` ``[C, C]``."""
    w = weight.to(torch.float64).clone()  # [d_out, C]
    hinv = _inverse_covariance(mean, second, damping)  # [C, C]
    left = {i: (list(dict.fromkeys(int(u) for u in units)), int(count)) for i, (units, count) in enumerate(pools)}
    for i, (units, count) in left.items():
        if not 0 <= count <= len(units):
            raise ValueError(f"pool {i}: {count} units to remove of {len(units)} candidates")
    removed: list[int] = []
    while any(count for _, count in left.values()):
        step = _next_units(w, hinv, left, width)
        cols = torch.tensor([u * width + j for u in step for j in range(width)], dtype=torch.long)
        _obs_update(w, hinv, cols)
        removed += step
    return sorted(removed)


def _inverse_covariance(mean: torch.Tensor, second: torch.Tensor, damping: float) -> torch.Tensor:
    """``(S + lam I)^-1`` [C, C] float64 of the centred second moment ``S``."""
    mean = mean.to(torch.float64)
    h = second.to(torch.float64) - torch.outer(mean, mean)
    power = float(h.diagonal().clamp_min(0).mean())
    lam = damping * power if power > 0 else damping
    h.diagonal().add_(lam if lam > 0 else 1e-12)
    return torch.cholesky_inverse(torch.linalg.cholesky(h))


def _errors(w: torch.Tensor, hinv: torch.Tensor, units: list[int], width: int) -> torch.Tensor:
    """[len(units)] the OBS error ``tr(W_u [Hinv_uu]^-1 W_u^T)`` of removing each unit alone (the 1/2 dropped)."""
    cols = torch.tensor(units, dtype=torch.long)[:, None] * width + torch.arange(width)  # [n, width]
    w_u = w[:, cols].permute(1, 0, 2)  # [n, d_out, width]
    h_uu = hinv[cols[:, :, None], cols[:, None, :]]  # [n, width, width]
    if width == 1:
        return (w_u[:, :, 0] ** 2).sum(1) / h_uu[:, 0, 0]
    solved = torch.linalg.solve(h_uu, w_u.transpose(1, 2))  # [n, width, d_out] = Hinv_uu^-1 W_u^T
    return (w_u.transpose(1, 2) * solved).sum((1, 2))


def _next_units(w: torch.Tensor, hinv: torch.Tensor, left: dict, width: int) -> list[int]:
    """The units removed in this step (and ``left`` updated): the lowest-error candidate over all pools with units
    still to go; for single-column units, the lowest ``batch`` of the pool, ``batch`` an eighth of its count left
    (at least 1), so the errors are recomputed after every few removals while counts are small."""
    best: tuple[float, int, list[int]] | None = None
    for i, (units, count) in left.items():
        if not count:
            continue
        errors = _errors(w, hinv, units, width)
        take = max(1, math.ceil(count / 8)) if width == 1 else 1
        order = torch.argsort(errors)[:take].tolist()
        if best is None or float(errors[order[0]]) < best[0]:
            best = (float(errors[order[0]]), i, [units[k] for k in order])
    assert best is not None
    _, i, step = best
    units, count = left[i]
    gone = set(step)
    left[i] = ([u for u in units if u not in gone], count - len(step))
    return step


def _obs_update(w: torch.Tensor, hinv: torch.Tensor, cols: torch.Tensor) -> None:
    """In place: the kept columns of ``w`` take the OBS update for removing ``cols``, which become 0, and ``hinv``
    is downdated to the inverse over the columns kept (rows and columns ``cols`` 0)."""
    h_qq = hinv[cols][:, cols]  # [q, q]
    rows = hinv[cols]  # [q, C] Hinv_Q,:
    solved = torch.linalg.solve(h_qq, rows)  # [q, C] = Hinv_QQ^-1 Hinv_Q,:
    w.sub_(w[:, cols] @ solved)
    hinv.sub_(rows.T @ solved)
    w[:, cols] = 0
    hinv[cols, :] = 0
    hinv[:, cols] = 0
