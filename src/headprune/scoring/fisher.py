"""Empirical Fisher information of the head mask (Kwon et al. 2022, 4.1), from one backward per batch.

With per-example mask gradients ``g_b = dL_b/dxi`` ([B, H] per site, exact, from
:func:`headprune.scoring.gradients.mask_gradients`), the empirical Fisher of a site is
``F = sum_b g_b g_b^T`` ([H, H]); its diagonal ``sum_b g_b^2`` scores each head alone. To second
order, masking the heads where ``m = 0`` raises the loss by about ``1/2 (1 - m)^T F (1 - m)`` per
example / n: heads that are unimportant alone may still matter together, which the off-diagonal
block captures (used by :mod:`headprune.selection.rearrange`). Blocks are per site: interactions across sites
are not kept (Kwon et al. assume the Fisher is block diagonal by layer).

Sums, not means: the scores of different calibration sets are comparable only per example (``n``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .gradients import LossFn, gradient_sums


@dataclass
class Fisher:
    """Per site: ``diag`` [H] = sum over examples of dL_b/dxi_h squared; ``blocks`` [H, H] = sum of
    outer products (its diagonal is ``diag``); ``n`` examples scored. Float64."""

    diag: dict[str, torch.Tensor]
    blocks: dict[str, torch.Tensor]
    n: int

    def loss_increase(self, drop: Mapping[str, Iterable[int]]) -> float:
        """Second-order estimate of the summed loss increase of masking ``drop`` ({site: heads}):
        ``sum over sites of 1/2 (1 - m)^T F (1 - m)`` (per-site blocks only)."""
        return sum(quadratic(self.blocks[name], heads) for name, heads in drop.items())


def quadratic(block: torch.Tensor, dropped: Iterable[int]) -> float:
    """``1/2 (1 - m)^T F (1 - m)`` of one site, where ``1 - m`` is 1 exactly at the dropped heads."""
    idx = torch.as_tensor(sorted(set(int(h) for h in dropped)), dtype=torch.long)
    if idx.numel() == 0:
        return 0.0
    return 0.5 * float(block.index_select(0, idx).index_select(1, idx).sum())


def fisher_information(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    loss_fn: LossFn | None = None,
    mask: Mapping[str, torch.Tensor] | None = None,
    progress: bool = False,
) -> Fisher:
    """Diagonal and per-site blocks of the empirical Fisher of the head mask over ``batches``.

    Same inputs as :func:`headprune.head_importance` (labels in the batch, or ``loss_fn``); one
    forward and one activation backward per batch, no parameter gradients. ``mask``: the Fisher at
    that [H] mask instead of all ones. Padded rows contribute nothing.
    """
    blocks, n = gradient_sums(model, batches, lambda g: g.T @ g, loss_fn=loss_fn, mask=mask,  # [H, H]
                              progress=progress, desc="fisher")
    return Fisher(diag={k: b.diagonal().clone() for k, b in blocks.items()}, blocks=blocks, n=n)
