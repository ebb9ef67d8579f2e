"""Heads and FFN neurons scored together: per-example mask gradients of both in one backward.

Every site gets a batched head mask ``xi [batch, heads]`` and every FFN a batched neuron mask
``m [batch, width]``, all ones; with ``L = sum_b L_b`` the gradient ``dL/dm[b, i]`` is exactly
``dL_b/dm_i`` (example ``b`` flows only through row ``b``), as for heads
(:mod:`.gradients`). The empirical Fisher diagonal of each unit is the sum over examples of its
squared gradient (Kwon et al. 2022 score heads and neurons this way; their Fisher is block-diagonal
by layer, and here only its diagonal is kept for neurons).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from ..core.masks.masking import masked, masked_neurons, neuron_ones, ones_mask
from ..core.model.devices import accumulator_device, input_device, to_device
from ..core.model.ffn import find_ffns
from ..core.model.finite import check_finite, check_finite_scores, check_finite_weights, nonfinite_losses
from ..core.model.inputs import batch_size
from ..errors import ConfigError, NonFiniteError
from ..progress import progress_bar
from .fluctuation import StatsCollector
from .gradients import LossFn, batch_losses, scoring_mode


def unit_gradients(
    model: nn.Module, batch: Mapping[str, torch.Tensor], *, loss_fn: LossFn | None = None,
    heads: bool = True, neurons: bool = True,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
    """({site: dL_b/dxi [B, H]}, {ffn: dL_b/dm [B, width]}, valid [B]) from one forward and one backward. NaN or
    inf weights or losses are refused (:class:`~headprune.errors.NonFiniteError`)."""
    check_finite_weights(model)
    gh, gn, valid, losses = _batch_gradients(model, batch, loss_fn, heads, neurons)
    check_finite(losses, "the losses of the batch (one per example)")
    return gh, gn, valid


def _batch_gradients(model: nn.Module, batch: Mapping[str, torch.Tensor], loss_fn: LossFn | None, heads: bool,
                     neurons: bool):
    """:func:`unit_gradients` without its checks, and the batch's losses [B] (0 where not valid), detached."""
    n = batch_size(batch)
    batch = to_device(batch, input_device(model))
    xi = ones_mask(model, n, requires_grad=True) if heads else {}
    m = neuron_ones(model, n, requires_grad=True) if neurons else {}
    with scoring_mode(model), masked(model, xi), (masked_neurons(model, m) if neurons else nullcontext()), \
            torch.enable_grad():
        losses, valid = batch_losses(model, batch, loss_fn)
        leaves = [*xi.values(), *m.values()]
        grads = torch.autograd.grad((losses * valid).sum(), leaves, allow_unused=True)
    grads = [(g if g is not None else torch.zeros_like(t)).detach() for g, t in zip(grads, leaves, strict=True)]
    return (dict(zip(xi, grads[:len(xi)], strict=True)), dict(zip(m, grads[len(xi):], strict=True)), valid,
            torch.where(valid, losses.detach(), 0.0))


@dataclass
class UnitFisher:
    """Empirical Fisher diagonals, float64 sums over ``n`` examples: ``heads`` {site: [H]}, ``neurons``
    {ffn: [width]}; ``blocks`` {site: [H, H]} (heads only, for rearrangement)."""

    heads: dict[str, torch.Tensor]
    neurons: dict[str, torch.Tensor]
    blocks: dict[str, torch.Tensor]
    n: int


def unit_fisher(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], *, loss_fn: LossFn | None = None,
                heads: bool = True, neurons: bool = True, progress: bool = False,
                collect: StatsCollector | None = None) -> UnitFisher:
    """Fisher diagonals of head and neuron masks over ``batches`` (labelled, as for
    :func:`headprune.head_importance`); one forward and backward per batch. ``collect``: channel statistics
    gathered in the same forwards (``collect.finish()`` afterwards), so stand-ins need no pass of their own.
    NaN or inf weights, losses or sums are refused (:class:`~headprune.errors.NonFiniteError`)."""
    if neurons and not find_ffns(model):
        raise ConfigError(f"{type(model).__name__} has no feed-forward block headprune can find; neurons cannot "
                          "be scored (allowed: units=heads)")
    check_finite_weights(model)
    losses: list[torch.Tensor] = []  # [B] per batch, on the device, checked at the end
    h_tot: dict[str, torch.Tensor] = {}
    blocks: dict[str, torch.Tensor] = {}
    n_tot: dict[str, torch.Tensor] = {}
    count = 0
    with collect if collect is not None else nullcontext():
        for batch in progress_bar(batches, desc="fisher", unit="batch", show=progress):
            if collect is not None:
                collect.batch(to_device(batch, input_device(model)))
            gh, gn, valid, batch_losses = _batch_gradients(model, batch, loss_fn, heads, neurons)
            losses.append(batch_losses)
            count += _accumulate(gh, gn, valid, blocks, n_tot)
    blocks = {k: b.cpu() for k, b in blocks.items()}
    n_tot = {k: t.cpu() for k, t in n_tot.items()}
    if count == 0:
        raise ConfigError("batches: no example had anything to score (empty input or all padding)")
    h_tot = {k: b.diagonal().clone() for k, b in blocks.items()}
    refused = nonfinite_losses(losses)
    if refused:
        raise NonFiniteError(refused)
    check_finite_scores(h_tot | n_tot, "the fisher sums")
    return UnitFisher(heads=h_tot, neurons=n_tot, blocks=blocks, n=count)


def _accumulate(gh: dict[str, torch.Tensor], gn: dict[str, torch.Tensor], valid: torch.Tensor,
                blocks: dict[str, torch.Tensor], n_tot: dict[str, torch.Tensor]) -> int:
    """Add one batch's squared gradients (float64, on the device; moved once at the end) of its valid examples
    to the head blocks ``{site: [H, H]}`` and neuron sums ``{ffn: [width]}``; the number of valid examples."""
    for name, g in gh.items():
        g = g[valid.to(g.device)].to(accumulator_device(g.device), torch.float64)  # [n, H]
        blocks[name] = blocks.get(name, 0) + g.T @ g
    for name, g in gn.items():
        g = g[valid.to(g.device)].to(accumulator_device(g.device), torch.float64)  # [n, width]
        n_tot[name] = n_tot.get(name, 0) + g.pow(2).sum(0)
    return int(valid.sum())
