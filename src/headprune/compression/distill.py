"""Compensation by distillation: a few passes of training the pruned model to match the unpruned one.

After surgery (and the least-squares refit of :mod:`.reconstruct`), every weight of the pruned
``student`` is trained to reproduce the unpruned ``teacher``'s output distribution on calibration
inputs: the loss is ``KL(teacher || student)`` of the softmax over the output logits, averaged over
the positions that carry a prediction (a classifier's one row per example; a language model's or a
decoder's real tokens, read from ``labels != -100`` or the attention mask). No labels are read: the
teacher's distribution is the target, so the student learns what the unpruned model computes, not
more of the task. Dropout stays off (the student is in eval mode); AdamW with a learning rate that
decays linearly to 0 over the run.

It needs examples the guard never saw: :func:`headprune.compression.units.compress_pool` keeps it
only if it lowers the loss on the validation batches.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ..checks import check_int, check_number
from ..core.devices import input_device, to_device
from ..core.inputs import model_inputs
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
    params = [p for p in student.parameters() if p.is_floating_point()]
    if not params:
        raise ConfigError(f"{type(student).__name__} has no floating-point parameters to train")
    was = (student.training, teacher.training, [p.requires_grad for p in params])
    student.eval()
    teacher.eval()
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    order = list(range(len(batches)))
    rng = random.Random(seed)
    total = epochs * len(batches)
    losses, start = [], time.perf_counter()
    try:
        with progress_bar(total=total, desc="distill", unit="batch", show=progress) as bar:
            for _ in range(epochs):
                if shuffle:
                    rng.shuffle(order)
                for i in order:
                    for group in opt.param_groups:  # linear decay to 0 over the run
                        group["lr"] = lr * (1 - len(losses) / total)
                    loss = kl_to_teacher(student, teacher, batches[i])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    losses.append(float(loss.detach()))
                    bar.update()
    finally:
        student.train(was[0])
        teacher.train(was[1])
        for p, g in zip(params, was[2], strict=True):
            p.requires_grad_(g)
        opt.zero_grad(set_to_none=True)
    if not all(map(math.isfinite, losses)):
        raise ConfigError(f"distillation diverged (loss {losses[-1]}) at lr={lr}; allowed: a smaller lr")
    return {"steps": len(losses), "losses": losses, "seconds": time.perf_counter() - start, "lr": lr,
            "epochs": epochs}


def kl_to_teacher(student: nn.Module, teacher: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean ``KL(teacher || student)`` over the positions of ``batch`` that carry a prediction (a scalar
    with gradients through ``student``)."""
    s_batch = to_device(batch, input_device(student))
    with torch.no_grad():
        t_logits = _logits(teacher, to_device(batch, input_device(teacher)))
    s_logits = _logits(student, s_batch)
    t_logits = t_logits.to(s_logits.device)
    if t_logits.shape != s_logits.shape:
        raise ConfigError(f"the pruned model's logits {tuple(s_logits.shape)} do not match the unpruned model's "
                          f"{tuple(t_logits.shape)}")
    t = torch.log_softmax(t_logits.float(), -1)
    s = torch.log_softmax(s_logits.float(), -1)
    per = (t.exp() * (t - s)).sum(-1)  # [B] or [B, T]
    keep = positions(student, s_batch, per.shape)
    if keep is None:
        return per.mean()
    keep = keep.to(per.device)
    if not bool(keep.any()):
        raise ConfigError("a distillation batch has no real positions (all padding)")
    return per[keep].mean()


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


def _logits(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    out = model(**model_inputs(model, batch, labels=False, cache=False))
    logits = getattr(out, "logits", None)
    if logits is None:
        raise ConfigError(f"{type(model).__name__} returns no logits; distillation needs a model with an output "
                          "head (a classifier, a language model or a seq2seq model)")
    return logits
