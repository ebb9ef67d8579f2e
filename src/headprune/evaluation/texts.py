"""``batches`` from plain text for the library API: ``hp.text_batches(tokenizer, texts, labels)``.

What :func:`headprune.head_importance`, :func:`headprune.fisher_information` and
:func:`headprune.compress` iterate over, built the way the evaluators build theirs: truncated,
padded per batch by the tokenizer, labels mapped to the model's ids as in evaluation.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..checks import check_int
from ..errors import ConfigError, DataError
from .base import check_strings
from .data import encode_labels


def text_batches(tokenizer, texts: Sequence[str], labels: Sequence | None = None, *,
                 text_pairs: Sequence[str] | None = None, batch_size: int = 32, max_length: int = 128,
                 label2id: Mapping[str, int] | Any = None, device: torch.device | str | None = None,
                 ) -> list[dict[str, torch.Tensor]]:
    """``texts`` (and ``labels``) as a list of model inputs, ``batch_size`` examples each, in the given order.

    A batch holds ``input_ids [B, T]`` and ``attention_mask [B, T]`` (``token_type_ids [B, T]`` when the
    tokenizer makes them), each text (pair) truncated to ``max_length`` tokens and padded to the longest
    in its batch, on the tokenizer's padding side; with ``labels``, ``labels [B]``. Labels are class ids
    (ints), or strings mapped through ``label2id``: a mapping ``{label: id}`` or the model's config
    (its ``label2id``/``id2label``, any case; integer strings are ids). Leave ``labels`` out for a causal
    LM (it scores its own next tokens). Tensors are created on ``device`` (e.g. ``model.device``; default:
    the CPU).
    """
    texts = check_strings("texts", texts)
    if not texts:
        raise DataError("texts: empty; allowed: a list of at least one str")
    check_int("batch_size", batch_size, 1)
    check_int("max_length", max_length, 2)
    pairs = None if text_pairs is None else check_strings("text_pairs", text_pairs)
    if pairs is not None and len(pairs) != len(texts):
        raise DataError(f"text_pairs: {len(pairs)} entries for {len(texts)} texts; allowed: one per text")
    ids = None if labels is None else _label_ids(labels, len(texts), label2id)
    if getattr(tokenizer, "pad_token_id", None) is None:
        raise ConfigError("tokenizer has no pad token (pad_token_id=None); allowed: a tokenizer with one, e.g. "
                          "tokenizer.pad_token = tokenizer.eos_token")
    out = []
    for start in range(0, len(texts), batch_size):
        rows = slice(start, start + batch_size)
        encoded = tokenizer(texts[rows], None if pairs is None else pairs[rows], truncation=True,
                            max_length=max_length, padding=True, return_tensors="pt")
        batch = {key: value.to(device) for key, value in encoded.items()}
        if ids is not None:
            batch["labels"] = torch.tensor(ids[rows], dtype=torch.long, device=device)
        out.append(batch)
    return out


def _label_ids(labels: Sequence, n: int, label2id: Any) -> list[int]:
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise DataError(f"labels: {type(labels).__name__}; allowed: a list of class ids (int) or label strings")
    if len(labels) != n:
        raise DataError(f"labels: {len(labels)} entries for {n} texts; allowed: one label per text")
    if label2id is not None:
        return encode_labels([str(x) for x in labels], label2id)
    for i, label in enumerate(labels):
        if isinstance(label, bool) or not isinstance(label, numbers.Integral) or label < 0:
            raise DataError(f"labels[{i}] = {label!r:.40} ({type(label).__name__}); allowed: a class id (int >= 0), "
                            "or give label2id= (a mapping {label: id} or the model's config) for label strings")
    return [int(x) for x in labels]
