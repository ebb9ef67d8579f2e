"""Head importance I_h = E_x |dL(x)/dxi_h| (paper 4.1), exact and per example, one backward per batch.

The per-example gradients come from one mask-gradient pass (:func:`.gradients.mask_gradients`: a
batched mask, one backward per batch, no parameter gradients). ``|.|`` is taken per example, then averaged over the examples that have
anything to score (padded rows and tokens contribute nothing).

``absolute="batch"`` gives what Hugging Face's bertology example computed instead (the absolute
value of the gradient summed over a batch), for comparison.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ..errors import ConfigError
from .gradients import LossFn, gradient_sums


def head_importance(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    loss_fn: LossFn | None = None,
    normalize: str | None = "l2",
    absolute: str = "example",
    mask: Mapping[str, torch.Tensor] | None = None,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """I_h per site: {site name: tensor [num_heads]}.

    ``batches`` yields model inputs (with ``labels`` unless ``loss_fn`` is given, or a causal LM,
    which is scored on its own inputs). ``loss_fn(outputs, batch) -> [batch]`` per-example losses.
    ``normalize``: ``"l2"`` (per site, paper 4.1) or None. ``absolute``: ``"example"`` (exact
    I_h) or ``"batch"`` (|sum over a batch|, the bertology variant). ``mask``: score the model as
    masked by this [num_heads] mask (for iterative pruning); masked heads still get a gradient.
    """
    if normalize not in (None, "l2"):
        raise ConfigError(f"normalize={normalize!r}; allowed: 'l2' or None")
    total, count = importance_sums(model, batches, loss_fn=loss_fn, absolute=absolute, mask=mask, progress=progress)
    scores = {name: (t / count).float() for name, t in total.items()}
    return normalize_per_site(scores) if normalize == "l2" else scores


def importance_sums(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    loss_fn: LossFn | None = None,
    absolute: str = "example",
    mask: Mapping[str, torch.Tensor] | None = None,
    progress: bool = False,
) -> tuple[dict[str, torch.Tensor], int]:
    """({site: sum over examples of |dL_b/dxi_h|, [H] float64}, examples scored): the sums behind
    :func:`head_importance` (I_h = sum / n), so that sums and counts from several processes or data
    shards add up before the division."""
    if absolute not in ("example", "batch"):
        raise ConfigError(f"absolute={absolute!r}; allowed: 'example', 'batch'")
    reduce = (lambda g: g.abs().sum(0)) if absolute == "example" else (lambda g: g.sum(0).abs())  # [H]
    return gradient_sums(model, batches, reduce, loss_fn=loss_fn, mask=mask, progress=progress, desc="importance")


def normalize_per_site(scores: Mapping[str, torch.Tensor], eps: float = 1e-20) -> dict[str, torch.Tensor]:
    """Divide each site's scores by their l2 norm (paper 4.1: "normalised per layer")."""
    return {name: s / s.norm(p=2).clamp_min(eps) for name, s in scores.items()}


