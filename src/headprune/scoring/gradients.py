"""One mask-gradient pass: per-example dL_b/dxi_h for every head, exact, in one backward per batch.

Every site gets a *batched* mask ``xi [batch, heads]`` of ones. Example ``b`` only flows through
row ``b``, so with ``L = sum_b L_b`` the gradient ``dL/dxi[b, h]`` is exactly ``dL_b/dxi_h``: one
backward pass gives every example's gradient. Parameters are frozen during scoring, so no weight
gradient is computed. I_h (:mod:`.importance`) and the Fisher (:mod:`.fisher`) are two reductions
of these gradients (:func:`gradient_sums`).

The mask is applied on top of any mask the model already has (``with hp.masked(model, m):``): the
gradients are then those of the masked model, and heads the outer mask switches off get zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sized
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..core.devices import accumulator_device, input_device, to_device
from ..core.inputs import batch_size, model_inputs, rows_with_tokens
from ..core.masking import HeadMask, masked, ones_mask
from ..distributed import rank_world, reduce_sums, shard
from ..errors import ConfigError, DataError

LossFn = Callable[[object, Mapping[str, torch.Tensor]], torch.Tensor]  # (outputs, batch) -> [B]


def gradient_sums(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    reduce: Callable[[torch.Tensor], torch.Tensor],
    *,
    loss_fn: LossFn | None = None,
    mask: Mapping[str, torch.Tensor] | None = None,
    progress: bool = False,
    desc: str = "scoring",
) -> tuple[dict[str, torch.Tensor], int]:
    """({site: sum over batches of ``reduce(g)``}, examples scored), with ``g`` [n_valid, H] float64 the
    per-example mask gradients of a batch's examples that have anything to score.

    The sums are accumulated in float64 on each site's device (no copy per batch) and moved to the CPU
    once, at the end. Inside :func:`headprune.distributed.sharded`, each rank takes every world-th batch
    and the sums and counts are all-reduced."""
    totals: dict[str, torch.Tensor] = {}
    counts: list[torch.Tensor] = []  # [] per batch, on the device: no synchronisation per batch
    rank, world = rank_world()
    total = len(range(rank, len(batches), world)) if isinstance(batches, Sized) else None  # this rank's batches
    for batch in tqdm(shard(batches), desc=desc, unit="batch", total=total, disable=not progress):
        grads, valid = mask_gradients(model, batch, loss_fn=loss_fn, mask=mask)
        counts.append(valid.sum())
        for name, g in grads.items():  # g [B, H]
            part = reduce(g[valid.to(g.device)].to(accumulator_device(g.device), torch.float64))
            totals[name] = part if name not in totals else totals[name] + part
    count = int(sum(int(c) for c in counts))
    totals, count = reduce_sums(totals, count)  # over the ranks under torchrun (headprune.distributed)
    totals = {name: t.cpu() for name, t in totals.items()}
    if count == 0:
        raise ConfigError("batches: no example had anything to score (empty input or all padding)")
    bad = [name for name, t in totals.items() if not bool(torch.isfinite(t).all())]
    if bad:  # never pick heads from NaN scores
        raise DataError(f"scores of sites {bad} are NaN or inf: the model's weights or the batches' values are not "
                        "finite, so no head can be ranked; allowed: a model and inputs with finite values")
    return totals, count


def mask_gradients(
    model: nn.Module, batch: Mapping[str, torch.Tensor], *, loss_fn: LossFn | None = None,
    mask: Mapping[str, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per-example mask gradients of one batch: ({site: dL_b/dxi [B, H]}, valid [B] bool).

    One forward and one backward; parameters are frozen meanwhile; the model runs in eval mode.
    """
    n = batch_size(batch)
    batch = to_device(batch, input_device(model))
    xi = ones_mask(model, n)  # on each site's device
    for name, value in (mask or {}).items():  # start from the given [H] mask, one row per example
        xi[name] = torch.as_tensor(value, dtype=torch.float32).to(xi[name].device).expand(n, -1).clone()
    for t in xi.values():
        t.requires_grad_(True)
    with scoring_mode(model), masked(model, xi), torch.enable_grad():
        outputs = model(**model_inputs(model, batch, labels=loss_fn is not None, cache=False))
        losses, valid = example_losses(model, batch, outputs, loss_fn)
        names = list(xi)
        grads = torch.autograd.grad((losses * valid).sum(), [xi[n] for n in names], allow_unused=True)
    out = {n: (g if g is not None else torch.zeros_like(xi[n])).detach() for n, g in zip(names, grads, strict=True)}
    return out, valid


def mean_loss(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], *, mask: HeadMask | None = None,
              loss_fn: LossFn | None = None) -> float:
    """Mean per-example loss over ``batches`` (the same loss the scores use), under ``mask``; no gradients."""
    total, n = 0.0, 0
    with scoring_mode(model), torch.no_grad(), (masked(model, mask) if mask else nullcontext()):
        for batch in batches:
            batch = to_device(batch, input_device(model))
            losses, valid = example_losses(model, batch, model(**model_inputs(model, batch, labels=loss_fn is not None, cache=False)), loss_fn)
            total += float(losses[valid].sum())
            n += int(valid.sum())
    if n == 0:
        raise ConfigError("batches: no example had a loss (empty input or all padding)")
    return total / n


def example_losses(model: nn.Module, batch: Mapping[str, torch.Tensor], outputs,
                    loss_fn: LossFn | None) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] losses, [B] valid) of one batch: ``loss_fn``'s, else the model's own; rows without tokens invalid."""
    n = batch_size(batch)
    if loss_fn is not None:
        losses = loss_fn(outputs, batch)
        valid = torch.ones(n, dtype=torch.bool, device=losses.device)
    else:
        losses, valid = per_example_loss(model, batch, outputs)
    if losses.shape != (n,):
        raise ConfigError(f"loss_fn must return one loss per example, shape ({n},); "
                          f"got {tuple(losses.shape)}")
    return losses, valid & rows_with_tokens(batch).to(valid.device)


def per_example_loss(model: nn.Module, batch: Mapping[str, torch.Tensor], outputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own loss, one value per example: ([B] losses, [B] valid).

    Sequence classification: cross-entropy (MSE for one regression label). Token outputs
    (causal LM, seq2seq, token classification): mean cross-entropy over the example's tokens
    whose label is not -100 (labels shifted by one for causal LMs; a causal LM without labels
    predicts its own ``input_ids`` where ``attention_mask`` is 1, and no target is scored whose
    predicting position is padding: the first real token of a left-padded row has no context).
    """
    logits = outputs.logits  # the loss in float32 at least (a bfloat16/float16 model's gradients stay in its dtype)
    logits = logits.float() if logits.is_floating_point() and logits.element_size() < 4 else logits
    labels = batch.get("labels")
    causal = _is_causal_lm(model)
    if labels is None and causal:
        labels = batch["input_ids"].masked_fill(batch.get("attention_mask", torch.ones_like(batch["input_ids"])) == 0, -100)
    if labels is None:
        raise ConfigError("batch has no 'labels'; pass labels in the batch or a loss_fn(outputs, batch) -> [batch]")
    labels = labels.to(logits.device)  # a model spread by a device_map returns its logits on the last device
    if logits.dim() == 2:  # [B, C]
        if logits.shape[-1] == 1 and labels.is_floating_point():
            return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype), reduction="none"), torch.ones_like(labels, dtype=torch.bool)
        valid = labels != -100
        return F.cross_entropy(logits, labels.clamp_min(0), reduction="none") * valid, valid
    if causal:
        logits, labels = logits[:, :-1], labels[:, 1:]
        mask = batch.get("attention_mask")
        if mask is not None:  # a target predicted from a padding position (left padding) means nothing: not scored
            labels = labels.masked_fill(mask[:, :-1].to(labels.device) == 0, -100)
    token = F.cross_entropy(logits.transpose(1, 2), labels.clamp_min(0), reduction="none")  # [B, T]
    keep = labels != -100
    n_tokens = keep.sum(-1)
    return (token * keep).sum(-1) / n_tokens.clamp_min(1), n_tokens > 0


def _is_causal_lm(model: nn.Module) -> bool:
    name = type(model).__name__
    return not getattr(model.config, "is_encoder_decoder", False) and (
        name.endswith("ForCausalLM") or name.endswith("LMHeadModel"))


@contextmanager
def scoring_mode(model: nn.Module):
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
