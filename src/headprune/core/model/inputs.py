"""Model inputs: one helper for every stage that runs a model on a batch (scoring, tuning, costs).

A batch is a mapping of tensors whose first dimension is the batch (``input_ids [B, T]``,
``attention_mask [B, T]``, ``labels [B]`` or ``[B, T]``, ``decoder_input_ids [B, T_dec]`` ...).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch
from torch import nn

from ...checks import check_int
from ...errors import ConfigError
from .devices import input_device, to_device


def unwrap(model: nn.Module) -> nn.Module:
    """The eager module of a ``torch.compile`` wrapper (the model itself otherwise)."""
    return getattr(model, "_orig_mod", model)


def model_inputs(model: nn.Module, batch: Mapping[str, torch.Tensor], *, labels: bool = False,
                 cache: bool = True) -> dict:
    """``batch`` as keyword arguments for ``model``: ``labels`` dropped unless ``labels=True`` (an
    encoder-decoder keeps them: they build its decoder inputs); ``use_cache=False`` unless ``cache``."""
    inputs = dict(batch)
    if not labels and not getattr(model.config, "is_encoder_decoder", False):
        inputs.pop("labels", None)
    if not cache and "use_cache" in inspect.signature(unwrap(model).forward).parameters:
        inputs["use_cache"] = False  # one forward, nothing to cache
    return inputs


def batch_size(batch: Mapping[str, torch.Tensor]) -> int:
    """The first dimension of the batch's first tensor with one."""
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    raise ConfigError(f"batch has no tensor inputs (keys: {list(batch)})")


def rows_with_tokens(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """[B] bool: examples with at least one real token (all of them without an attention mask)."""
    mask = batch.get("attention_mask")
    if mask is None:
        first = next(v for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        return torch.ones(batch_size(batch), dtype=torch.bool, device=first.device)
    return mask.reshape(mask.shape[0], -1).sum(-1) > 0


def real_rows(model: nn.Module, batch: Mapping[str, torch.Tensor], kind: str,
              shape: torch.Size) -> torch.Tensor | None:
    """Which of the ``B*T`` rows of a ``[B, T, C]`` activation inside a ``kind`` block (``encoder`` |
    ``decoder`` | ``cross``) are real tokens (bool ``[B*T]``), or None when all count / it cannot be told.
    An encoder-decoder's decoder rows are its scored targets (``labels != -100``) or its decoder mask."""
    if len(shape) != 3:
        return None
    bt = tuple(shape[:2])
    if getattr(model.config, "is_encoder_decoder", False) and kind != "encoder":
        labels, dmask = batch.get("labels"), batch.get("decoder_attention_mask")
        if labels is not None and tuple(labels.shape) == bt:
            return (labels != -100).flatten()
        return dmask.bool().flatten() if dmask is not None and tuple(dmask.shape) == bt else None
    amask = batch.get("attention_mask")
    return amask.bool().flatten() if amask is not None and tuple(amask.shape) == bt else None


def example_inputs(model: nn.Module, batch: int, seq_len: int, *, tgt_len: int | None = None,
                   seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids ``[batch, seq_len]`` (no padding), ``decoder_input_ids [batch, tgt_len]`` for
    encoder-decoders, ``use_cache=False``: what costs and timings run."""
    check_int("batch", batch, 1)
    check_int("seq_len", seq_len, 1)
    check_int("tgt_len", tgt_len, 1, optional=True)
    model = unwrap(model)
    config = model.config
    vocab = getattr(config, "vocab_size", None) or model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(seed)
    low = 3 if vocab > 3 else 0  # skip pad/bos/eos of most vocabularies
    ids = torch.randint(low, vocab, (batch, seq_len), generator=g)
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(config, "is_encoder_decoder", False):
        x["decoder_input_ids"] = torch.randint(low, vocab, (batch, tgt_len or seq_len), generator=g)
    return model_inputs(model, to_device(x, input_device(model)), cache=False)  # beside the model


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every position, ``[B, T]``, from ``logits [B, T, V]`` and ``labels [B, T]``
    (-100: not scored, 0 there), computed as models compute their own ``.loss``: float32 at least, on
    the flattened ``[B*T, V]`` layout.

    Not ``F.cross_entropy(logits.transpose(1, 2), labels)``: on the CPU that layout sums the softmax
    over a strided dimension and comes out biased low, by 1.2e-4 of SmolLM2's loss over its 49,152-token
    vocabulary (issue 38), more than the own-loss check allows.
    """
    if logits.is_floating_point() and logits.element_size() < 4:
        logits = logits.float()
    labels = labels.to(logits.device)
    b, t, v = logits.shape
    token = torch.nn.functional.cross_entropy(logits.reshape(b * t, v), labels.reshape(b * t),
                                              ignore_index=-100, reduction="none")  # [B*T]
    return token.view(b, t)
