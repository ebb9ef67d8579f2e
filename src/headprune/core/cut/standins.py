"""Linear stand-ins for removed units: each removed input feature replaced by its best affine prediction from the
kept ones (``compensate="linear"``), the first-order step past FLAP's bias compensation.

An output projection ``y = W x + b`` (``W``: ``[d_out, C]``) loses the input features ``R`` of its removed units
(a head's ``head_dim`` features, a neuron's one). Bias compensation (:mod:`.biases`) holds ``x_R`` at its mean
``mu_R``: the best *constant* stand-in. Over the calibration tokens, the best *affine* stand-in from the kept
features ``K`` is the regression ``x_R ~ mu_R + A (x_K - mu_K)`` with ``A = C_RK (C_KK + lam I)^-1`` (``C``: the
features' covariance; ``lam = damping x`` the mean variance of the kept features, a ridge towards the mean
stand-in). Folding it into the kept columns and the bias,

    W_K' = W_K + W_R A,        b' = b + W_R mu_R - W_R A mu_K,

minimises the projection's mean squared output change on those tokens among all stand-ins that are affine in
the kept features (``lam = 0``), so on them it is never worse than the mean; ``damping -> inf`` gives the mean
stand-in exactly. Where every feature goes (a site that loses all its heads) it is the mean stand-in.

It needs the features' second moments (:func:`headprune.scoring.fluctuation.channel_stats` with ``gram=True``),
``C^2`` numbers per projection, gathered in the same forward pass as FLAP's statistics: no gradients, no labels,
no layer-by-layer pass. Unlike the bias shift it is a fit, so it can overfit few tokens; the ridge and the
held-out choice of configuration (``benchmarks/llm_peers.py``) are its guards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ...errors import PlanError
from ..model.ffn import find_ffns
from ..model.sites import Site, find_sites, is_conv1d
from .biases import shift_biases


def affine_standin(weight: torch.Tensor, mean: torch.Tensor, second: torch.Tensor, removed: torch.Tensor,
                   damping: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kept feature indices ``[k]``, the change of the kept columns ``[d_out, k]``, the bias shift ``[d_out]``),
    float64, for a projection ``weight`` ``[d_out, C]`` whose input features ``removed`` ``[r]`` go, from the
    features' ``mean`` ``[C]`` and second moment ``second`` ``[C, C]`` (``E[x x^T]``)."""
    width = weight.shape[1]
    drop = torch.zeros(width, dtype=torch.bool)
    drop[removed] = True
    kept = (~drop).nonzero().flatten()
    removed = drop.nonzero().flatten()
    mean = mean.to(torch.float64)
    w_r = weight[:, removed].to(torch.float64)  # [d_out, r]
    shift = w_r @ mean[removed]  # the mean stand-in
    if kept.numel() == 0 or removed.numel() == 0:
        return kept, torch.zeros(weight.shape[0], kept.numel(), dtype=torch.float64), shift
    # one [k, k] matrix beside ``second``, centred, ridged and factored in place: at 8192 features each copy is
    # half a gigabyte, what the block-by-block stand-ins' peak memory is made of
    k = kept.numel()
    c_kk = torch.empty(k, k, dtype=torch.float64).mT  # [k, k] C_KK, column-major: LAPACK factors it where it is
    c_kr = torch.empty(k, removed.numel(), dtype=torch.float64)  # [k, r] C_KR
    for start in range(0, k, 256):  # a block of rows at a time: no [k, C] or [k, k] index copies
        rows = second.index_select(0, kept[start:start + 256]).to(torch.float64)  # [<=256, C]
        c_kk[:, start:start + 256] = rows.index_select(1, kept).T  # symmetric: rows are columns, contiguous here
        c_kr[start:start + 256] = rows.index_select(1, removed)
    c_kk.addr_(mean[kept], mean[kept], alpha=-1)
    c_kr.addr_(mean[kept], mean[removed], alpha=-1)
    power = float(c_kk.diagonal().clamp_min(0).mean())
    lam = damping * power if power > 0 else damping
    if lam > 0:
        c_kk.diagonal().add_(lam)  # the ridge
    try:
        low = torch.linalg.cholesky(c_kk, out=c_kk)  # C_KK + lam I = L L^T, symmetric positive definite
    except torch.linalg.LinAlgError:  # kept features that are linearly dependent, with no ridge to separate them
        raise PlanError(f"damping={damping}: the kept features' covariance is singular; allowed: a damping > 0 "
                        "(e.g. the default 0.01)") from None
    a_t = torch.linalg.solve_triangular(low.mT, torch.linalg.solve_triangular(low, c_kr, upper=False),
                                        upper=True)  # [k, r] = A^T
    delta = w_r @ a_t.T  # [d_out, k]
    return kept, delta, shift - delta @ mean[kept]


def linear_standins(model: nn.Module, means: Mapping[str, torch.Tensor], seconds: Mapping[str, torch.Tensor],
                    drop_heads: Mapping[str, Iterable[int]], drop_neurons: Mapping[str, Iterable[int]],
                    damping: float = 1e-2) -> dict[str, int]:
    """Fold affine stand-ins of the units to drop ({site: head indices}, {ffn: neuron indices}) into ``model``'s
    output / down projections, in place, before surgery cuts their columns. ``means`` {name: [C]} and ``seconds``
    {name: [C, C]} are the inputs' first and second moments. Returns {name: kept features refitted}."""
    sites = {s.name: s for s in find_sites(model)}
    ffns = {f.name: f for f in find_ffns(model, skip_moe=True)} if any(drop_neurons.values()) else {}
    shifts, changes, done = {}, [], {}
    for groups, drops in ((sites, drop_heads), (ffns, drop_neurons)):
        for name, drop in drops.items():
            drop = sorted(int(i) for i in drop)
            if not drop:
                continue
            if name not in groups or name not in means or name not in seconds:
                raise PlanError(f"no {'site' if groups is sites else 'FFN'} {name!r} with input moments; allowed: "
                                f"{', '.join(n for n in groups if n in means and n in seconds)}")
            unit = groups[name]
            width = unit.head_dim if isinstance(unit, Site) else 1
            module = unit.o if isinstance(unit, Site) else unit.down
            weight = module.weight.detach()
            w = (weight.T if is_conv1d(module) else weight).cpu()  # [d_out, C]
            c = w.shape[1]
            if tuple(means[name].shape) != (c,) or tuple(seconds[name].shape) != (c, c):
                raise PlanError(f"input moments of {name!r} have shapes {tuple(means[name].shape)}, "
                                f"{tuple(seconds[name].shape)}; expected ({c},), ({c}, {c})")
            cols = torch.tensor([i * width + j for i in drop for j in range(width)], dtype=torch.long)
            kept, delta, shift = affine_standin(w, means[name], seconds[name], cols, damping)
            changes.append((module, kept, delta))
            shifts[name] = shift
            done[name] = int(kept.numel())
    shift_biases(model, shifts)  # checked before anything changes
    with torch.no_grad():
        for module, kept, delta in changes:
            if kept.numel() == 0:
                continue
            index = kept.to(module.weight.device)
            if is_conv1d(module):  # [C, d_out]
                module.weight.index_add_(0, index, delta.T.to(module.weight.device, module.weight.dtype))
            else:
                module.weight.index_add_(1, index, delta.to(module.weight.device, module.weight.dtype))
    return done
