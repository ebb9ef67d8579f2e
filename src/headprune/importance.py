"""Head importance I_h = E_x |dL(x)/dxi_h| (paper 4.1), exact and per example, one backward per batch.

Every site gets a *batched* mask ``xi [batch, heads]`` of ones. Example ``b`` only flows through
row ``b``, so with ``L = sum_b L_b`` the gradient ``dL/dxi[b, h]`` is exactly ``dL_b/dxi_h``: one
backward pass gives every example's gradient. Parameters are frozen during scoring, so no weight
gradient is computed. ``|.|`` is taken per example, then averaged over the examples that have
anything to score (padded rows and tokens contribute nothing).

``absolute="batch"`` gives what Hugging Face's bertology example computed instead (the absolute
value of the gradient summed over a batch), for comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .errors import ConfigError
from .masking import HeadMask, masked, ones_mask
from .sites import find_sites

LossFn = Callable[[object, Mapping[str, torch.Tensor]], torch.Tensor]  # (outputs, batch) -> [B]


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
    if absolute not in ("example", "batch"):
        raise ConfigError(f"absolute={absolute!r}; allowed: 'example', 'batch'")
    sites = find_sites(model)
    total = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in sites}
    count = 0
    for batch in tqdm(batches, desc="importance", unit="batch", disable=not progress):
        grads, valid = mask_gradients(model, batch, loss_fn=loss_fn, mask=mask)
        count += int(valid.sum())
        for name, g in grads.items():  # g [B, H]
            g = g[valid].double()
            total[name] += g.abs().sum(0) if absolute == "example" else g.sum(0).abs()
    if count == 0:
        raise ConfigError("batches: no example had anything to score (empty input or all padding)")
    scores = {name: (t / count).float() for name, t in total.items()}
    return normalize_per_site(scores) if normalize == "l2" else scores


def normalize_per_site(scores: Mapping[str, torch.Tensor], eps: float = 1e-20) -> dict[str, torch.Tensor]:
    """Divide each site's scores by their l2 norm (paper 4.1: "normalised per layer")."""
    return {name: s / s.norm(p=2).clamp_min(eps) for name, s in scores.items()}


def mask_gradients(
    model: nn.Module, batch: Mapping[str, torch.Tensor], *, loss_fn: LossFn | None = None,
    mask: Mapping[str, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per-example mask gradients of one batch: ({site: dL_b/dxi [B, H]}, valid [B] bool).

    One forward and one backward; parameters are frozen meanwhile; the model runs in eval mode.
    """
    batch_size = _batch_size(batch)
    xi = ones_mask(model, batch_size)
    for name, value in (mask or {}).items():  # start from the given [H] mask, one row per example
        xi[name] = torch.as_tensor(value, dtype=torch.float32).expand(batch_size, -1).clone()
    for t in xi.values():
        t.requires_grad_(True)
    with _scoring(model), masked(model, xi), torch.enable_grad():
        outputs = model(**_model_inputs(model, batch, loss_fn))
        losses, valid = _example_losses(model, batch, outputs, loss_fn)
        names = list(xi)
        grads = torch.autograd.grad((losses * valid).sum(), [xi[n] for n in names], allow_unused=True)
    out = {n: (g if g is not None else torch.zeros_like(xi[n])).detach() for n, g in zip(names, grads, strict=True)}
    return out, valid


def mean_loss(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], *, mask: HeadMask | None = None,
              loss_fn: LossFn | None = None) -> float:
    """Mean per-example loss over ``batches`` (the same loss the scores use), under ``mask``; no gradients."""
    total, n = 0.0, 0
    with _scoring(model), torch.no_grad(), (masked(model, mask) if mask else nullcontext()):
        for batch in batches:
            losses, valid = _example_losses(model, batch, model(**_model_inputs(model, batch, loss_fn)), loss_fn)
            total += float(losses[valid].sum())
            n += int(valid.sum())
    if n == 0:
        raise ConfigError("batches: no example had a loss (empty input or all padding)")
    return total / n


def _example_losses(model: nn.Module, batch: Mapping[str, torch.Tensor], outputs,
                    loss_fn: LossFn | None) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] losses, [B] valid) of one batch: ``loss_fn``'s, else the model's own; rows without tokens invalid."""
    batch_size = _batch_size(batch)
    if loss_fn is not None:
        losses, valid = loss_fn(outputs, batch), torch.ones(batch_size, dtype=torch.bool)
    else:
        losses, valid = per_example_loss(model, batch, outputs)
    if losses.shape != (batch_size,):
        raise ConfigError(f"loss_fn must return one loss per example, shape ({batch_size},); "
                          f"got {tuple(losses.shape)}")
    return losses, valid & _rows_with_tokens(batch)


def per_example_loss(model: nn.Module, batch: Mapping[str, torch.Tensor], outputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own loss, one value per example: ([B] losses, [B] valid).

    Sequence classification: cross-entropy (MSE for one regression label). Token outputs
    (causal LM, seq2seq, token classification): mean cross-entropy over the example's tokens
    whose label is not -100 (labels shifted by one for causal LMs; a causal LM without labels
    predicts its own ``input_ids`` where ``attention_mask`` is 1).
    """
    logits = outputs.logits
    labels = batch.get("labels")
    causal = _is_causal_lm(model)
    if labels is None and causal:
        labels = batch["input_ids"].masked_fill(batch.get("attention_mask", torch.ones_like(batch["input_ids"])) == 0, -100)
    if labels is None:
        raise ConfigError("batch has no 'labels'; pass labels in the batch or a loss_fn(outputs, batch) -> [batch]")
    if logits.dim() == 2:  # [B, C]
        if logits.shape[-1] == 1 and labels.is_floating_point():
            return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype), reduction="none"), torch.ones_like(labels, dtype=torch.bool)
        valid = labels != -100
        return F.cross_entropy(logits, labels.clamp_min(0), reduction="none") * valid, valid
    if causal:
        logits, labels = logits[:, :-1], labels[:, 1:]
    token = F.cross_entropy(logits.transpose(1, 2), labels.clamp_min(0), reduction="none")  # [B, T]
    keep = labels != -100
    n_tokens = keep.sum(-1)
    return (token * keep).sum(-1) / n_tokens.clamp_min(1), n_tokens > 0


def _is_causal_lm(model: nn.Module) -> bool:
    name = type(model).__name__
    return not getattr(model.config, "is_encoder_decoder", False) and (
        name.endswith("ForCausalLM") or name.endswith("LMHeadModel"))


def _model_inputs(model: nn.Module, batch: Mapping[str, torch.Tensor], loss_fn) -> dict:
    inputs = dict(batch)
    if loss_fn is None and not getattr(model.config, "is_encoder_decoder", False):
        inputs.pop("labels", None)  # we compute the loss per example ourselves
    return inputs


def _rows_with_tokens(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    mask = batch.get("attention_mask")
    if mask is None:
        return torch.ones(_batch_size(batch), dtype=torch.bool)
    return mask.reshape(mask.shape[0], -1).sum(-1) > 0


def _batch_size(batch: Mapping[str, torch.Tensor]) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    raise ConfigError(f"batch has no tensor inputs (keys: {list(batch)})")


@contextmanager
def _scoring(model: nn.Module):
    """Eval mode and frozen parameters, restored afterwards."""
    was_training = model.training
    frozen = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)
        model.train(was_training)
