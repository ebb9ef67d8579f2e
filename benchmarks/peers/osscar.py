"""OSSCAR: one-shot structured pruning by combinatorial optimisation (Meng, Behdin, Wang & Mazumder, "OSSCAR:
One-Shot Structured Pruning in Vision and Language Models with Combinatorial Optimization", ICML 2024; code
github.com/mazumder-lab/OSSCAR for OPT, GQA and Hugging Face export in LinkedIn's FMCHISEL; the method is
re-implemented from the paper, nothing copied).

Per consumer layer (o_proj: groups = heads; down_proj: groups = neurons), on the inputs ``X`` of the model
already pruned below it, OSSCAR solves

    min over kept groups S with |S| = n - k  of  min_{W'_S} 1/2 ||X_S W'_S^T - X W^T||^2  (+ a small ridge),

in three steps, as the paper:

1. **Greedy removal**: the group whose removal raises the objective least, by the Schur complement of ``H``
   (the OBS cost ``1/2 tr(W_Q [Hinv_QQ]^-1 W_Q^T)`` at the current refit), one group at a time with the
   refit after each (:func:`peers.obs.greedy_remove`).
2. **Local search**: every swap of a removed group ``Q`` for a kept group ``P`` is priced exactly
   (:func:`swap_deltas`: ``Q`` added by the Schur complement of the kept set, then ``P``'s OBS cost in the
   enlarged set) and the best swap is made while it lowers the objective (at most ``max_swaps`` per layer).
3. **Refit**: the kept columns set to the least-squares optimum (:func:`peers.obs.refit`).

Budget: the same share of units in every layer, as the paper prunes (``r = target / parameters of all
layers' units``; heads ``int(r x H)`` per layer, then neurons until the layer has lost ``r`` of its
parameters). Damping: 1% of the mean diagonal of ``X^T X`` (the public code's ``lambda2 1e-2``). GQA: query
heads are the groups of o_proj; a key/value head goes with its group's last query head.

Knobs (:func:`osscar_plan`; ``benchmarks/llm_peers.py --choose-peer-knobs`` chooses among them on held-out
calibration blocks): ``damping``; ``head_rounding``, how many heads a layer's ratio ``r`` asks for: ``"floor"``
removes ``int(r x H)`` (the default here), ``"ceil"`` keeps ``int(H x (1 - r))`` as the public code counts
(``osscar_prune.py``: ``int(num_cin * (1 - sp))`` kept), removing one more head whenever ``r x H`` is not whole
(the layer's neurons make up the rest of its share either way); ``max_swaps``, the local search's budget per
layer (0: greedy removal and refit only, as the public code without ``--local_out`` / ``--local_fc``).
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from headprune.errors import ConfigError

from .obs import block_cost, greedy_remove, layerwise, objective, refit
from .plan import Ledger, Plan, layer_pairs

DAMPING = 0.01
MAX_SWAPS = 100
# heads a layer of H heads loses at ratio r: floor removes int(r H); ceil keeps int(H (1 - r)), the public code's count
HEAD_ROUNDING = {"floor": lambda share, n: int(share * n), "ceil": lambda share, n: n - int(n * (1 - share))}


def _kept_state(w0: torch.Tensor, h: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W at the refit of ``kept``, Hinv: ``H_SS^-1`` embedded at the kept columns, zero elsewhere)."""
    hinv = torch.zeros_like(h)
    hinv[kept.unsqueeze(1), kept.unsqueeze(0)] = torch.linalg.inv(h[kept][:, kept])
    return refit(w0, h, kept), hinv


def swap_deltas(w0: torch.Tensor, h: torch.Tensor, groups: torch.Tensor, kept: list[int],
                removed: list[int]) -> torch.Tensor:
    """[len(removed), len(kept)]: the exact change of the objective when removed group ``Q`` comes back and kept
    group ``P`` goes. ``Q`` is added by the Schur complement ``s = H_QQ - H_QS Hinv_S H_SQ`` (the objective
    falls by ``1/2 tr(r^T s^-1 r)``, ``r = G_Q - H_Q,: W^T``), then ``P`` pays its OBS cost in the enlarged set
    (its weights ``W_P - c^T b_P^T`` and ``Hinv_PP + b_P s^-1 b_P^T``, ``b = Hinv H_:,Q``, ``c = s^-1 r``)."""
    kept_cols = groups[kept].flatten()
    w, hinv = _kept_state(w0, h, kept_cols)
    g = h @ w0.T  # [C, d_out]
    out = torch.empty(len(removed), len(kept), dtype=w0.dtype)
    kg = groups[kept]  # [n_kept, g]
    w_p = w[:, kg].permute(1, 0, 2)  # [n_kept, d_out, g]
    hinv_pp = hinv[kg.unsqueeze(-1), kg.unsqueeze(-2)]  # [n_kept, g, g]
    bs = hinv @ h[:, groups[removed].flatten()]  # [C, len(removed) * g]: zero outside the kept columns
    width = groups.shape[1]
    if width == 1:  # single columns (neurons): every pair at once, as matrices [removed, kept]
        return _column_swaps(w, h, g, bs, kg[:, 0], groups[removed][:, 0], hinv_pp[:, 0, 0])
    for i, q in enumerate(removed):
        cols = groups[q]
        b = bs[:, i * width:(i + 1) * width]  # [C, g]
        s = h[cols][:, cols] - h[cols] @ b  # [g, g]
        r = g[cols] - h[cols] @ w.T  # [g, d_out]
        c = torch.linalg.solve(s, r)  # [g, d_out]
        gain = 0.5 * (r * c).sum()
        b_p = b[kg]  # [n_kept, g, g_q]
        w_new = w_p - torch.einsum("qd,npq->ndp", c, b_p)  # [n_kept, d_out, g]: W_P - c^T b_P^T
        hinv_new = hinv_pp + b_p @ torch.linalg.solve(s, b_p.transpose(1, 2))  # [n_kept, g, g]
        out[i] = block_cost(w_new, hinv_new) - gain
    return out


def _column_swaps(w, h, g, b, kept, removed, hinv_kk) -> torch.Tensor:
    """:func:`swap_deltas` for groups of one column: ``b`` [C, r] = ``Hinv H_:,R``, ``kept`` [k] and ``removed``
    [r] column indices, ``hinv_kk`` [k] the diagonal of ``Hinv`` at the kept columns."""
    s = h[removed, removed] - (h[removed] * b.T).sum(1)  # [r]: Schur complements
    r = g[removed] - h[removed] @ w.T  # [r, d_out]
    c = r / s.unsqueeze(1)  # [r, d_out]
    gain = 0.5 * (r * c).sum(1)  # [r]
    w_k = w[:, kept]  # [d_out, k]
    b_k = b[kept].T  # [r, k]
    norm = w_k.pow(2).sum(0)  # [k]
    cross = c @ w_k  # [r, k]: c_i . w_j
    new_norm = norm - 2 * b_k * cross + b_k.pow(2) * c.pow(2).sum(1, keepdim=True)  # ||w_j - c_i b_ji||^2
    new_hinv = hinv_kk + b_k.pow(2) / s.unsqueeze(1)  # [r, k]
    return 0.5 * new_norm / new_hinv - gain.unsqueeze(1)


def local_search(w0: torch.Tensor, h: torch.Tensor, groups: torch.Tensor, dropped: list[int],
                 max_swaps: int = MAX_SWAPS) -> tuple[list[int], int]:
    """(dropped groups after the search, swaps made): the best swap while it lowers the objective."""
    dropped = sorted(dropped)
    kept = [j for j in range(groups.shape[0]) if j not in dropped]
    swaps = 0
    while swaps < max_swaps and dropped and kept:
        deltas = swap_deltas(w0, h, groups, kept, dropped)
        best = int(torch.argmin(deltas))
        i, j = divmod(best, len(kept))
        if float(deltas[i, j]) >= -1e-10 * max(objective(w0, h, groups[kept].flatten()), 1e-300):
            break
        dropped[i], kept[j] = kept[j], dropped[i]
        dropped.sort()
        kept.sort()
        swaps += 1
    return dropped, swaps


def osscar_remove(w0: torch.Tensor, h: torch.Tensor, groups: torch.Tensor, k: int,
                  max_swaps: int = MAX_SWAPS) -> tuple[list[int], torch.Tensor, int]:
    """OSSCAR on one layer: greedy removal of ``k`` groups, local search, refit -> (dropped groups, W', swaps)."""
    dropped, _, _ = greedy_remove(w0, h, groups, k)
    dropped, swaps = local_search(w0, h, groups, dropped, max_swaps)
    kept = torch.tensor([j for j in range(groups.shape[0]) if j not in dropped], dtype=torch.long)
    return dropped, refit(w0, h, groups[kept].flatten() if kept.numel() else kept), swaps


def osscar_plan(model: nn.Module, batches, budget: float, *, damping: float = DAMPING,
                max_swaps: int = MAX_SWAPS, head_rounding: str = "floor") -> Plan:
    """OSSCAR's plan removing ``budget`` of the non-embedding parameters (refit o/down weights folded)."""
    if head_rounding not in HEAD_ROUNDING:
        raise ConfigError(f"head_rounding={head_rounding!r}; allowed: {', '.join(map(repr, HEAD_ROUNDING))}")
    if not (isinstance(max_swaps, int) and max_swaps >= 0):
        raise ConfigError(f"max_swaps={max_swaps!r}; allowed: an integer >= 0")
    if not (isinstance(damping, (int, float)) and math.isfinite(damping) and damping > 0):
        raise ConfigError(f"damping={damping!r}; allowed: a finite number > 0")
    start = time.perf_counter()
    batches = list(batches)
    ledger = Ledger(model, budget)
    pairs = layer_pairs(ledger)
    ratio = ledger.target / sum(ledger.layer_pool(layer) for layer, _, _ in pairs)

    swaps: list[int] = []  # per consumer layer, in order: swaps the local search made

    def remover(w, h, groups, k):
        dropped, w_new, n = osscar_remove(w, h, groups, k, max_swaps)
        swaps.append(n)
        return dropped, w_new

    weights = layerwise(model, batches, ledger, [ratio] * len(pairs), remover, remover, damping,
                        heads_of=HEAD_ROUNDING[head_rounding])
    plan = ledger.plan("osscar", info={"ratio_per_layer": ratio, "damping": damping, "max_swaps": max_swaps,
                                       "head_rounding": head_rounding,
                                       "swaps_per_consumer": swaps,
                                       "steps": "greedy Schur-complement removal, best-swap local search, "
                                                "least-squares refit", "sequential": True,
                                       "seconds": time.perf_counter() - start},
                       weights={k: v.to(torch.float32) for k, v in weights.items()})
    return plan
