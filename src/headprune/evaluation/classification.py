"""Sequence (pair) classification: accuracy, binary F1 (MRPC) and Matthews correlation (CoLA)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..checks import check_int
from ..core.model.devices import input_device, to_device
from ..core.model.finite import check_finite, check_finite_weights
from ..distributed import reduce_arrays, shard
from ..errors import ConfigError, DataError
from ..progress import progress_bar
from ..provenance import portable_path
from .base import EvalResult, check_strings, check_trained, check_unbatched, mask_context
from .batching import Batches, length_buckets, pad_rows
from .data import ClassificationData, check_limit, encode_labels
from .metrics import accuracy_from_confusion, confusion_matrix, f1_from_confusion, matthews_from_confusion

METRICS = ("accuracy", "f1", "matthews")
GENERATIVE = ("ForConditionalGeneration", "ForCausalLM", "LMHeadModel", "ForMaskedLM", "MTModel")  # class suffixes


class Classification:
    """Texts (and optional text pairs) with gold labels; each text is one example.

    ``data``: a :class:`headprune.evaluation.data.ClassificationData`, or ``(texts, labels)`` /
    ``(texts, labels, text_pairs)``. Labels (strings, or ints) become ids through ``label2id`` when
    given, else ``config`` (a model config's ``label2id``/``id2label``); integer strings are taken as
    ids. With both, ``config`` gives the number of labels and ``label2id`` must map into it.
    Texts are truncated to ``max_length`` tokens and batched by length.

    The score is ``metric``; ``extra`` holds accuracy, matthews and (two classes only) f1 = F1 of
    class 1. ``per_example`` in data order: ``correct`` (0/1), ``pred``, ``label``, ``loss``
    (cross-entropy).
    """

    def __init__(self, tokenizer, data: ClassificationData | Sequence, *, config: Any = None,
                 label2id: Mapping[str, int] | None = None, max_length: int = 128, batch_size: int = 32,
                 metric: str = "accuracy"):
        if metric not in METRICS:
            raise ConfigError(f"metric={metric!r}; allowed: {', '.join(METRICS)}")
        check_int("max_length", max_length, 2)
        check_int("batch_size", batch_size, 1)
        if config is None and label2id is None:
            raise ConfigError("give config= (the model's config, for its label2id) or label2id={label: id} "
                              "(or both: the model's number of labels from config, the ids from label2id)")
        if isinstance(data, ClassificationData) and data.labels is None:
            shown = f"; its columns: {', '.join(data.columns)}" if data.columns else ""
            raise DataError(f"the data {data.source!r} has no label column{shown}; pass label_column= with the "
                            "column that holds the labels")
        texts, labels, pairs, source = _unpack(data)
        model_labels = int(getattr(config, "num_labels", 0) or 0) if config is not None else 0
        if label2id is None:
            _check_label_count(labels, config, source)
            self.label_ids = encode_labels(labels, config)
        else:
            self.label_ids = encode_labels(labels, label2id, num_labels=model_labels or None)
        self.num_labels = model_labels or len(label2id)
        self.num_labels = max(self.num_labels, max(self.label_ids) + 1)
        if metric == "f1" and self.num_labels != 2:
            raise ConfigError(f"metric='f1' is the F1 of class 1 of a binary task; this task has "
                              f"{self.num_labels} labels; allowed: 'accuracy' or 'matthews'")
        self.pad_id = _pad_id(tokenizer)
        self.pad_type_id = getattr(tokenizer, "pad_token_type_id", 0) or 0
        self.padding_side = getattr(tokenizer, "padding_side", "right")
        encoded = tokenizer(texts, pairs, truncation=True, max_length=max_length)
        types = "token_type_ids" in encoded
        self.features = [{"input_ids": list(ids), "attention_mask": [1] * len(ids),
                          **({"token_type_ids": list(encoded["token_type_ids"][i])} if types else {})}
                         for i, ids in enumerate(encoded["input_ids"])]
        self.metric, self.batch_size = metric, batch_size
        self.signature = {"task": "classification", "data": portable_path(source), "n": len(texts), "pairs": pairs is not None,
                          "metric": metric, "num_labels": self.num_labels, "max_length": max_length,
                          "batch_size": batch_size}

    def __len__(self) -> int:
        return len(self.features)

    def _buckets(self, limit: int | None) -> list[list[int]]:
        check_limit(limit)
        n = len(self) if limit is None else min(limit, len(self))
        return length_buckets([len(f["input_ids"]) for f in self.features[:n]], batch_size=self.batch_size)

    def _inputs(self, idx: list[int]) -> dict[str, torch.Tensor]:
        rows = [self.features[i] for i in idx]
        pads = {"input_ids": self.pad_id, "attention_mask": 0, "token_type_ids": self.pad_type_id}
        return {k: pad_rows([r[k] for r in rows], v, self.padding_side) for k, v in pads.items() if k in rows[0]}

    def batches(self, *, limit: int | None = None) -> Batches:
        """Model inputs with ``labels`` [B], length-bucketed, for importance scoring; ``len`` is their count."""
        buckets = self._buckets(limit)
        return Batches(({**self._inputs(idx), "labels": torch.tensor([self.label_ids[i] for i in idx])}
                        for idx in buckets), len(buckets))

    @torch.no_grad()
    def evaluate(self, model, mask: Mapping[str, torch.Tensor] | None = None, *, progress: bool = False,
                 limit: int | None = None) -> EvalResult:
        check_unbatched(mask, "Classification.evaluate")
        check_trained(model, "Classification.evaluate")
        if type(model).__name__.endswith(GENERATIVE):
            raise ConfigError(f"Classification.evaluate: {type(model).__name__} is a generative model; allowed: a "
                              "sequence classification model (e.g. BertForSequenceClassification)")
        check_finite_weights(model)
        model.eval()
        buckets = self._buckets(limit)
        n = sum(len(b) for b in buckets)
        pred, loss = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.float64)
        tokens = 0
        start = time.perf_counter()
        with mask_context(model, mask):
            for i, idx in progress_bar(list(shard(enumerate(buckets))), desc="classification", unit="batch",
                                       show=progress):
                inputs = to_device(self._inputs(idx), input_device(model))
                logits = model(**inputs).logits
                if logits.dim() != 2 or logits.shape[-1] < max(self.num_labels, 2):
                    raise ConfigError(f"model output logits of shape {tuple(logits.shape)}; classification needs "
                                      f"[batch, >= {max(self.num_labels, 2)} labels] (a ...ForSequenceClassification)")
                gold = torch.tensor([self.label_ids[i] for i in idx], device=logits.device)
                check_finite(logits, f"the logits of batch {i}")
                pred[idx] = logits.argmax(-1).cpu().numpy()
                loss[idx] = F.cross_entropy(logits.float(), gold, reduction="none").double().cpu().numpy()
                tokens += int(inputs["attention_mask"].sum())
        pred, loss, tokens = reduce_arrays(pred, loss, np.array([tokens]))  # under torchrun: each rank's examples
        tokens = int(tokens[0])
        seconds = time.perf_counter() - start
        label = np.asarray(self.label_ids[:n], dtype=np.int64)
        counts = confusion_matrix(pred, label, num_classes=max(self.num_labels, int(pred.max()) + 1))
        extra = {"accuracy": accuracy_from_confusion(counts), "matthews": matthews_from_confusion(counts)}
        if self.num_labels == 2:
            extra["f1"] = f1_from_confusion(counts, positive=1)
        extra["signature"] = {**self.signature, "n": n}
        return EvalResult(metric=self.metric, score=extra[self.metric], n=n,
                          per_example={"correct": (pred == label).astype(np.int64), "pred": pred, "label": label,
                                       "loss": loss},
                          extra=extra, seconds=seconds, tokens=tokens)


def _unpack(data: Any) -> tuple[list[str], list, list[str] | None, str]:
    if isinstance(data, ClassificationData):
        return list(data.texts), data.labels, None if data.text_pairs is None else list(data.text_pairs), data.source
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        raise DataError(f"data: {type(data).__name__}; allowed: ClassificationData, (texts, labels) or "
                        "(texts, labels, text_pairs)")
    texts, labels, pairs = (*data, None) if len(data) == 2 else data
    texts = check_strings("texts", texts)
    if not texts:
        raise DataError("texts: empty; classification needs at least one example")
    if labels is None or len(labels) != len(texts):
        raise DataError(f"labels: {'None' if labels is None else len(labels)} entries for {len(texts)} texts; "
                        "allowed: one label per text")
    if pairs is not None and len(check_strings("text_pairs", pairs)) != len(texts):
        raise DataError(f"text_pairs: {len(pairs)} entries for {len(texts)} texts; allowed: one per text")
    return texts, [str(x) for x in labels], None if pairs is None else list(pairs), "in-memory"


def _check_label_count(labels, config, source: str) -> None:
    """More distinct labels in the data than the classifier has outputs: refused, naming both counts."""
    n_model = int(getattr(config, "num_labels", 0) or 0)
    found = sorted({str(x) for x in labels or []}, key=lambda x: (len(x), x))
    if n_model and len(found) > n_model:
        shown = ", ".join(f"{x!r:.24}" for x in found[:6]) + (", ..." if len(found) > 6 else "")
        raise ConfigError(f"the data {source!r} has {len(found)} distinct labels ({shown}) but the model "
                          f"classifies into num_labels={n_model}; allowed: data with at most {n_model} labels (is "
                          "the label column right?), or a classifier trained on these labels (headprune train "
                          "classifier)")


def _pad_id(tokenizer) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        raise ConfigError("tokenizer has no pad token (pad_token_id=None); allowed: a tokenizer with one, e.g. "
                          "tokenizer.pad_token = tokenizer.eos_token")
    return int(pad)
