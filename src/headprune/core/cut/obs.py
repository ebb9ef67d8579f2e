"""Which units of one projection to remove, given how many: greedy removal by the output error left after the
best linear stand-in (the structured Optimal Brain Surgeon error), for ``compensate="obs-seq"``.

A consumer projection ``y = W x + b`` (``W``: ``[d_out, C]``) reads units of ``width`` input columns each (a head's
``head_dim``, a neuron's one). Over the calibration tokens, with the inputs' covariance ``S`` (centred: the bias
takes the mean, as :func:`headprune.core.cut.standins.affine_standin`) ridged to ``H = S + lam I``
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
    state = _State(weight.to(torch.float64).clone(), _inverse_covariance(mean, second, damping))
    left = {i: (list(dict.fromkeys(int(u) for u in units)), int(count)) for i, (units, count) in enumerate(pools)}
    for i, (units, count) in left.items():
        if not 0 <= count <= len(units):
            raise ValueError(f"pool {i}: {count} units to remove of {len(units)} candidates")
    removed: list[int] = []
    while any(count for _, count in left.values()):
        step = _next_units(state, left, width)
        state.remove(torch.tensor([u * width + j for u in step for j in range(width)], dtype=torch.long))
        removed += step
    return sorted(removed)


class _State:
    """``w`` ``[d_out, K]`` and ``Hinv`` ``[K, K]`` over K input columns: the columns still kept and those removed
    since the last compaction (their rows and columns of ``Hinv`` and columns of ``w`` are 0, so they take no part
    in any update). Compacted to the kept columns once a quarter of K is removed, so later steps work on fewer
    columns without copying both matrices at every step. ``at`` maps an original column to its position."""

    def __init__(self, w: torch.Tensor, hinv: torch.Tensor):
        self.w, self.hinv = w, hinv
        self.at = torch.arange(hinv.shape[0], device=hinv.device)  # [C] original column -> position (-1: compacted)
        self.gone = torch.zeros(hinv.shape[0], dtype=torch.bool, device=hinv.device)  # [K] removed, not compacted

    def cols(self, original: torch.Tensor) -> torch.Tensor:
        return self.at[original.to(self.at.device)]

    def remove(self, original: torch.Tensor) -> None:
        """In place: the kept columns of ``w`` take the OBS update for removing the columns ``original``, which
        become 0, and ``Hinv`` is downdated to the inverse over the columns kept (the Schur complement)."""
        q = self.cols(original)
        h_q = self.hinv.index_select(0, q)  # [q, K] Hinv_Q,:
        solved = torch.linalg.solve(h_q.index_select(1, q), h_q)  # [q, K] = Hinv_QQ^-1 Hinv_Q,:
        self.w.addmm_(self.w.index_select(1, q), solved, alpha=-1)
        self.hinv.addmm_(h_q.T, solved, alpha=-1)
        self.w[:, q] = 0
        self.hinv[q, :] = 0
        self.hinv[:, q] = 0
        self.gone[q] = True
        if 4 * int(self.gone.sum()) >= len(self.gone):
            self._compact()

    def _compact(self) -> None:
        k = (~self.gone).nonzero().squeeze(1)
        self.w = self.w.index_select(1, k)
        self.hinv = self.hinv.index_select(0, k).index_select(1, k)
        alive = self.at >= 0
        self.at[alive] = torch.where(self.gone, -1, torch.cumsum(~self.gone, 0) - 1)
        self.gone = torch.zeros(len(k), dtype=torch.bool, device=k.device)


def _inverse_covariance(mean: torch.Tensor, second: torch.Tensor, damping: float) -> torch.Tensor:
    """``(S + lam I)^-1`` [C, C] float64 of the centred second moment ``S``."""
    return torch.cholesky_inverse(torch.linalg.cholesky(ridged_covariance(mean, second, damping)))


def ridged_covariance(mean: torch.Tensor, second: torch.Tensor, damping: float) -> torch.Tensor:
    """``S + lam I`` [C, C] float64: the centred second moment ``S`` ridged by ``lam = damping x mean diag S``."""
    mean = mean.to(torch.float64)
    h = second.to(torch.float64) - torch.outer(mean, mean)
    power = float(h.diagonal().clamp_min(0).mean())
    lam = damping * power if power > 0 else damping
    h.diagonal().add_(lam if lam > 0 else 1e-12)
    return h


def _errors(state: _State, units: list[int], width: int) -> torch.Tensor:
    """[len(units)] the OBS error ``tr(W_u [Hinv_uu]^-1 W_u^T)`` of removing each unit alone (the 1/2 dropped)."""
    cols = state.cols(torch.tensor(units, dtype=torch.long)[:, None] * width + torch.arange(width))  # [n, width]
    w_u = state.w[:, cols].permute(1, 0, 2)  # [n, d_out, width]
    h_uu = state.hinv[cols[:, :, None], cols[:, None, :]]  # [n, width, width]
    if width == 1:
        return (w_u[:, :, 0] ** 2).sum(1) / h_uu[:, 0, 0]
    solved = torch.linalg.solve(h_uu, w_u.transpose(1, 2))  # [n, width, d_out] = Hinv_uu^-1 W_u^T
    return (w_u.transpose(1, 2) * solved).sum((1, 2))


def _next_units(state: _State, left: dict, width: int) -> list[int]:
    """The units removed in this step (and ``left`` updated): the lowest-error candidate over all pools with units
    still to go; for single-column units, the lowest ``batch`` of the pool, ``batch`` an eighth of its count left
    (at least 1), so the errors are recomputed after every few removals while counts are small."""
    best: tuple[float, int, list[int]] | None = None
    for i, (units, count) in left.items():
        if not count:
            continue
        errors = _errors(state, units, width)
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
