"""Compensation by distillation: a few passes of training the pruned model to match the unpruned one.

After surgery (and the least-squares refit of :mod:`.reconstruct`), every weight of the pruned
``student`` is trained to reproduce the unpruned ``teacher``'s output distribution on calibration
inputs: the loss is ``KL(teacher || student)`` of the softmax over the output logits, averaged over
the positions that carry a prediction (a classifier's one row per example; a language model's or a
decoder's real tokens, read from ``labels != -100`` or the attention mask). No labels are read: the
teacher's distribution is the target, so the student learns what the unpruned model computes, not
more of the task. Dropout stays off (the student is in eval mode); AdamW with a learning rate that
decays linearly to 0 over the run.

It needs examples the guard never saw: :func:`headprune.compression.compress` keeps it
only if it lowers the loss on the validation batches.

The loss (:func:`distill_loss`, optionally with the hidden states), the training context
(:func:`trainable`) and the step (:func:`train_step`) are shared with :mod:`.recover`, the resumable
recovery of a saved pruned model over many tokens.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from ..checks import check_int, check_number
from ..core.model.chunked import TokenOutputs, chunked_kl, kl_rows, token_outputs
from ..core.model.devices import input_device, to_device
from ..core.model.inputs import model_inputs
from ..errors import ConfigError
from ..progress import progress_bar


def distill(
    student: nn.Module,
    teacher: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    epochs: int = 1,
    lr: float = 2e-5,
    shuffle: bool = True,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Train ``student`` in place towards ``teacher``'s outputs on ``batches``; returns the per-step losses.

    ``batches``: model inputs (labels only mark which decoder positions are real); ``epochs`` passes
    over them, in an order shuffled with ``seed`` (``shuffle=False``: as given). Returns
    ``{"steps", "losses" [per step], "seconds", "lr", "epochs"}``.
    """
    check_int("epochs", epochs, 1)
    check_number("lr", lr, low=0, strict=True)
    batches = list(batches)
    if not batches:
        raise ConfigError("batches: empty; distillation needs calibration inputs")
    order = list(range(len(batches)))
    rng = random.Random(seed)
    total = epochs * len(batches)
    losses, start = [], time.perf_counter()
    with trainable(student, teacher) as params:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        try:
            with progress_bar(total=total, desc="distill", unit="batch", show=progress) as bar:
                for _ in range(epochs):
                    if shuffle:
                        rng.shuffle(order)
                    for i in order:  # linear decay to 0 over the run
                        losses.append(train_step(opt, lambda b=batches[i]: kl_to_teacher(student, teacher, b),
                                                 lr * (1 - len(losses) / total)))
                        bar.update()
        finally:
            opt.zero_grad(set_to_none=True)
    if not all(map(math.isfinite, losses)):
        raise ConfigError(f"distillation diverged (loss {losses[-1]}) at lr={lr}; allowed: a smaller lr")
    return {"steps": len(losses), "losses": losses, "seconds": time.perf_counter() - start, "lr": lr,
            "epochs": epochs}


def kl_to_teacher(student: nn.Module, teacher: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean ``KL(teacher || student)`` over the positions of ``batch`` that carry a prediction (a scalar
    with gradients through ``student``)."""
    return distill_loss(student, teacher, batch)


def distill_loss(student: nn.Module, teacher: nn.Module, batch: Mapping[str, torch.Tensor], *,
                 hidden_weight: float = 0.0) -> torch.Tensor:
    """:func:`kl_to_teacher`, plus ``hidden_weight`` times the hidden states' mismatch where shapes allow:
    per layer whose student and teacher hidden states ([B, T, d]) have the same shape, the squared error
    over real positions relative to the teacher's mean square, averaged over those layers (pruning heads
    and neurons keeps the residual width, so every layer usually matches; none matching is refused)."""
    check_number("hidden_weight", hidden_weight, low=0)
    hidden = hidden_weight > 0
    s_batch = to_device(batch, input_device(student))
    with torch.no_grad():
        t_out = _outputs(teacher, to_device(batch, input_device(teacher)), hidden)
    s_out = _outputs(student, s_batch, hidden)
    t_shape, s_shape = _logits_shape(t_out), _logits_shape(s_out)
    if t_shape != s_shape:
        raise ConfigError(f"the pruned model's logits {s_shape} do not match the unpruned model's {t_shape}")
    keep = positions(student, s_batch, s_shape[:-1])
    if keep is not None and not bool(keep.any()):
        raise ConfigError("a distillation batch has no real positions (all padding)")
    if len(s_shape) == 2:  # a classifier's [B, C]
        per = kl_rows(t_out.features.to(s_out.features.device), s_out.features)  # [B]
        loss = per.mean()
    else:  # [B, T, V]: chunk by chunk, never all the logits at once
        per = chunked_kl(t_out, s_out, keep)  # [B, T], 0 outside keep
        loss = per.mean() if keep is None else per.sum() / keep.sum().to(per.device)
    if hidden:
        loss = loss + hidden_weight * _hidden_mismatch(s_out, t_out, keep)
    return loss


def _hidden_mismatch(s_out: TokenOutputs, t_out: TokenOutputs, keep: torch.Tensor | None) -> torch.Tensor:
    """Mean over the layers of matching shape of ``||h_s - h_t||^2 / ||h_t||^2`` at real positions."""
    s_states = getattr(s_out.outputs, "hidden_states", None) or ()
    t_states = getattr(t_out.outputs, "hidden_states", None) or ()
    pairs = [(hs, ht.to(hs.device)) for hs, ht in zip(s_states, t_states, strict=False) if hs.shape == ht.shape]
    if len(s_states) != len(t_states) or not pairs:
        raise ConfigError(f"hidden_weight > 0, but the pruned model's {len(s_states)} hidden states and the unpruned "
                          f"model's {len(t_states)} do not pair up with equal shapes; allowed: hidden_weight=0 "
                          "(logits only)")
    terms = []
    for hs, ht in pairs:  # [B, T, d]
        hs, ht = hs.float(), ht.float()
        if keep is not None and keep.shape == hs.shape[:-1]:
            hs, ht = hs[keep.to(hs.device)], ht[keep.to(hs.device)]
        terms.append((hs - ht).pow(2).mean() / ht.pow(2).mean().clamp_min(1e-12))
    return torch.stack(terms).mean()


@contextmanager
def trainable(student: nn.Module, teacher: nn.Module, only: str | None = None) -> Iterator[list[nn.Parameter]]:
    """Inside: both models in eval mode (no dropout: the student learns what the teacher computes) and the
    floating-point parameters of ``student`` whose names match the regular expression ``only`` (None: every
    one) trainable, the others frozen (yielded: the trainable ones, in ``parameters()`` order); restored after."""
    named = [(n, p) for n, p in student.named_parameters() if p.is_floating_point()]
    params = [p for n, p in named if only is None or re.search(only, n)]
    if not params:
        raise ConfigError(f"{type(student).__name__} has no floating-point parameters to train"
                          + ("" if only is None else f" matching train_only={only!r}"))
    was = (student.training, teacher.training, [p.requires_grad for _, p in named])
    student.eval()
    teacher.eval()
    chosen = {id(p) for p in params}
    for _, p in named:
        p.requires_grad_(id(p) in chosen)
    try:
        yield params
    finally:
        student.train(was[0])
        teacher.train(was[1])
        for (_, p), g in zip(named, was[2], strict=True):
            p.requires_grad_(g)


def train_step(opt: torch.optim.Optimizer, loss_fn: Callable[[], torch.Tensor], lr: float) -> float:
    """One optimizer step at learning rate ``lr`` on the loss ``loss_fn()`` returns; the loss as a float."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss = loss_fn()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def positions(model: nn.Module, batch: Mapping[str, torch.Tensor], shape: torch.Size) -> torch.Tensor | None:
    """Which of the ``[B, T]`` output positions are real (bool), or None when all are (or for ``[B]``)."""
    if len(shape) != 2:
        return None
    if getattr(model.config, "is_encoder_decoder", False):
        labels, dmask = batch.get("labels"), batch.get("decoder_attention_mask")
        if labels is not None and tuple(labels.shape) == tuple(shape):
            return labels != -100
        return dmask.bool() if dmask is not None and tuple(dmask.shape) == tuple(shape) else None
    amask = batch.get("attention_mask")
    return amask.bool() if amask is not None and tuple(amask.shape) == tuple(shape) else None


def _outputs(model: nn.Module, batch: Mapping[str, torch.Tensor], hidden: bool = False) -> TokenOutputs:
    """The model's forward on ``batch`` as :func:`headprune.core.model.chunked.token_outputs` gives it (hidden states
    and the checked head, or the full logits), with all hidden states in ``outputs`` when ``hidden``."""
    inputs = model_inputs(model, batch, labels=False, cache=False)
    if hidden:
        inputs["output_hidden_states"] = True
    out = token_outputs(model, inputs)
    if getattr(out.outputs, "logits", None) is None:
        raise ConfigError(f"{type(model).__name__} returns no logits; distillation needs a model with an output "
                          "head (a classifier, a language model or a seq2seq model)")
    return out


def _logits_shape(out: TokenOutputs) -> tuple[int, ...]:
    """The shape of the model's logits: ``[B, C]`` or ``[B, T, V]`` (whether or not they were all computed)."""
    return (*out.features.shape[:-1], out.vocab)
