"""Fine-tuning a pretrained encoder for (pair) classification; see the `headprune.train` doc."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ..checks import is_int
from ..errors import ConfigError, DataError, HeadpruneError
from ..evaluation.batching import length_buckets, pad_rows
from ..provenance import own_name, versions
from .batching import epoch_seed
from .checkpoint import data_fingerprint, find_resume, prepare_dir, settings_json
from .checks import check_stop, check_texts
from .job import Job
from .loop import TrainResult, fit
from .settings import ClassifierTrainSettings


def _pretrained_body(model_dir: str | Path, **config) -> nn.Module:
    """The encoder of ``model_dir`` with a fresh classification head: every parameter of the body must come
    from the checkpoint (a config over other weights is refused, :mod:`headprune.core.store.loading`); the new
    head is what this module trains, so the model is not marked as holding an untrained one."""
    from transformers.utils import logging as hf_logging

    from ..core.store.checkpoint import read_config
    from ..core.store.loading import NEW_HEAD_ATTR, check_load_report, load_failure
    from ..core.store.quiet import transformers_bars_off

    read_config(Path(model_dir))  # unreadable, custom code, quantized: one typed line before transformers reads it
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' "newly initialized" notice: the head is meant to be new
    try:
        with transformers_bars_off():
            model, info = AutoModelForSequenceClassification.from_pretrained(
                str(model_dir), local_files_only=True, output_loading_info=True, ignore_mismatched_sizes=True,
                **config)  # a head for another number of labels is replaced; a body of another shape refused
    except (HeadpruneError, OSError):
        raise
    except Exception as e:  # noqa: BLE001  # a config transformers cannot build, a refused pickle
        raise load_failure(e, model_dir) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    check_load_report(model, info, model_dir, new_head=True)
    model.__dict__.pop(NEW_HEAD_ATTR, None)
    return model


@dataclass
class ClassifierData:
    """The examples to fine-tune on (``texts``, with ``text_pairs`` for pairs, and their integer ``labels``) and,
    optionally, those scored after every epoch (``eval_*``, paired exactly when the training texts are).

    The number of labels is ``len(label_names)``, else ``num_labels``, else ``max(labels) + 1``; once built,
    ``num_labels`` holds it. ``label_names`` also set the config's ``id2label``/``label2id``."""

    texts: list[str]
    labels: list[int]
    text_pairs: list[str] | None = None
    eval_texts: list[str] | None = None
    eval_labels: list[int] | None = None
    eval_text_pairs: list[str] | None = None
    label_names: list[str] | None = None
    num_labels: int | None = None

    def __post_init__(self) -> None:
        self.texts = check_texts("texts", self.texts)
        if not self.texts:
            raise DataError("texts must hold at least one example, got 0")
        if self.text_pairs is not None:
            self.text_pairs = check_texts("text_pairs", self.text_pairs, len(self.texts))
        if self.label_names is not None:
            self.label_names = [str(x) for x in self.label_names]
            if self.num_labels is not None and self.num_labels != len(self.label_names):
                raise ConfigError(f"num_labels must equal len(label_names) ({len(self.label_names)}), "
                                  f"got {self.num_labels}")
            self.num_labels = len(self.label_names)
        self.labels = _check_labels("labels", self.labels, len(self.texts), self.num_labels)
        n_labels = self.num_labels if self.num_labels is not None else max(self.labels) + 1
        if not is_int(n_labels) or n_labels < 2:
            raise ConfigError(f"num_labels must be an int >= 2, got {n_labels!r}")
        self.num_labels = n_labels
        if self.eval_texts is not None or self.eval_labels is not None:
            if self.eval_texts is None or self.eval_labels is None:
                raise DataError("eval_texts and eval_labels must be given together")
            self.eval_texts = check_texts("eval_texts", self.eval_texts)
            self.eval_labels = _check_labels("eval_labels", self.eval_labels, len(self.eval_texts), n_labels)
            if (self.eval_text_pairs is None) != (self.text_pairs is None):
                raise DataError("eval_text_pairs must be given exactly when text_pairs is")
            if self.eval_text_pairs is not None:
                self.eval_text_pairs = check_texts("eval_text_pairs", self.eval_text_pairs, len(self.eval_texts))

    @property
    def has_eval(self) -> bool:
        return self.eval_texts is not None


def finetune_classifier(
    model_dir_or_model: str | Path | Any,
    tokenizer: Any | None,
    data: ClassifierData,
    *,
    settings: ClassifierTrainSettings,
    output_dir: str | Path,
    stop_after_epoch: int | None = None,
) -> TrainResult:
    """Fine-tune an encoder for (pair) classification with cross-entropy on ``data``; see the module doc.

    A directory is loaded with `AutoModelForSequenceClassification.from_pretrained(dir, num_labels=N)`
    (a fresh head drawn after `torch.manual_seed(seed)`), and its tokenizer when `tokenizer` is None.
    A model object is trained in place unless a checkpoint is resumed (then it is reloaded from there
    with `type(model).from_pretrained`). N is `data.num_labels`.
    `stop_after_epoch` ends this call early with a resumable checkpoint (no `final`).
    """
    s = settings
    if not isinstance(s, ClassifierTrainSettings):
        raise ConfigError(f"settings must be a ClassifierTrainSettings, got {type(s).__name__}")
    check_stop(stop_after_epoch)
    if not isinstance(data, ClassifierData):
        raise ConfigError(f"data must be a ClassifierData, got {type(data).__name__}")
    n_labels, label_names = data.num_labels, data.label_names
    from_dir = isinstance(model_dir_or_model, (str, Path))
    tokenizer = _tokenizer(model_dir_or_model, tokenizer, from_dir)
    label_kw: dict[str, Any] = {}
    if label_names is not None:
        label_kw = {"id2label": dict(enumerate(label_names)),
                    "label2id": {n: i for i, n in enumerate(label_names)}}
    torch.manual_seed(s.seed)  # the fresh head's draw; a body the weights do not hold is refused before out exists
    fresh = _pretrained_body(model_dir_or_model, num_labels=n_labels, **label_kw) if from_dir else None
    out = prepare_dir(output_dir)
    fingerprint = data_fingerprint(data.texts, data.text_pairs, data.labels, label_names, n_labels)
    resume = find_resume(out, "classifier", s, fingerprint)
    if resume is not None or fresh is None:
        torch.manual_seed(s.seed)
    if resume is not None:
        cls = AutoModelForSequenceClassification if from_dir else type(model_dir_or_model)
        model = cls.from_pretrained(str(out / f"epoch-{resume[0]}"), local_files_only=True)
    elif fresh is not None:
        model = fresh
    else:
        model = model_dir_or_model
        if model.config.num_labels != n_labels:
            raise ConfigError(f"the model's config.num_labels must equal the number of labels ({n_labels}), "
                              f"got {model.config.num_labels}")
        for k, v in label_kw.items():
            setattr(model.config, k, v)
    model.config.problem_type = "single_label_classification"
    encode, collate = _encoding(tokenizer, s.max_length)
    train = encode(data.texts, data.text_pairs)
    lengths = [len(f["input_ids"]) for f in train]
    y = torch.tensor(data.labels)

    def batches(epoch: int) -> list[list[int]]:
        return length_buckets(lengths, rng=random.Random(epoch_seed(s.seed, epoch)),
                                       sort_chunk=s.sort_chunk, batch_size=s.batch_size)

    total = sum(len(batches(e)) for e in range(1, s.epochs + 1))
    warm = math.ceil(s.warmup_ratio * total)

    def lr_factor(n: int) -> float:  # linear up over `warm` steps, then down to 1/(total - warm + 1)
        return n / warm if n <= warm else (total - n + 1) / (total - warm + 1)

    def loss(m: Any, idx: list[int]) -> tuple[torch.Tensor, int, int]:
        logits = m(**collate([train[i] for i in idx])).logits  # [B, num_labels]
        return F.cross_entropy(logits, y[idx]), len(idx), len(idx)

    evaluate = _evaluator(data, encode, collate, s.eval_batch_size) if data.has_eval else None
    info = {"task": "classifier", "n_train": len(data.texts), "n_eval": len(data.eval_texts) if data.has_eval else 0,
            "num_labels": n_labels, "label_names": label_names, "pairs": data.text_pairs is not None,
            "model": own_name(model_dir_or_model) if from_dir else type(model).__name__,
            "n_parameters": sum(p.numel() for p in model.parameters()), "total_steps": total,
            "settings": settings_json(s), "data_sha256": fingerprint, "versions": versions()}
    return fit(Job("classifier", model, tokenizer, s, out, info, resume, batches, loss, lr_factor, evaluate,
                     stop_after_epoch))


def _tokenizer(model_dir_or_model: Any, tokenizer: Any | None, from_dir: bool) -> Any:
    """``tokenizer``, else the model directory's own; one with a pad token."""
    if tokenizer is None:
        if not from_dir:
            raise ConfigError("tokenizer must be given when model_dir_or_model is a model object, got None")
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir_or_model), local_files_only=True)
    if tokenizer.pad_token_id is None:
        raise ConfigError("tokenizer must have a pad token (tokenizer.pad_token_id is None)")
    return tokenizer


def _encoding(tokenizer: Any, max_length: int) -> tuple[Callable, Callable]:
    """``encode(texts, pairs) -> [features]`` (truncated to ``max_length``) and ``collate(features) -> batch``."""
    def encode(a: list[str], b: list[str] | None) -> list[dict[str, list[int]]]:
        enc = tokenizer(a, b, truncation=True, max_length=max_length)
        keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
        return [{k: enc[k][i] for k in keys} for i in range(len(a))]

    def collate(feats: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        pad_id = tokenizer.pad_token_id
        return {k: pad_rows([f[k] for f in feats], pad_id if k == "input_ids" else 0) for k in feats[0]}

    return encode, collate


def _evaluator(data: ClassifierData, encode: Callable, collate: Callable, batch_size: int) -> Callable[[Any], dict]:
    """``evaluate(model) -> {eval_loss, eval_accuracy, eval_n}`` on ``data``'s evaluation examples (shortest first)."""
    ev = encode(data.eval_texts, data.eval_text_pairs)
    ev_order = sorted(range(len(ev)), key=lambda i: len(ev[i]["input_ids"]))
    ev_y = torch.tensor(data.eval_labels)

    @torch.no_grad()
    def evaluate(m: Any) -> dict:
        m.eval()
        nll, correct = 0.0, 0
        for start in range(0, len(ev_order), batch_size):
            idx = ev_order[start:start + batch_size]
            logits = m(**collate([ev[i] for i in idx])).logits
            nll += F.cross_entropy(logits, ev_y[idx], reduction="sum").item()
            correct += (logits.argmax(-1) == ev_y[idx]).sum().item()
        return {"eval_loss": nll / len(ev), "eval_accuracy": correct / len(ev), "eval_n": len(ev)}

    return evaluate


def _check_labels(name: str, labels: Any, n: int, num_labels: int | None) -> list[int]:
    if not isinstance(labels, (list, tuple)) or len(labels) != n:
        got = len(labels) if isinstance(labels, (list, tuple)) else type(labels).__name__
        raise DataError(f"{name} must be a list of {n} ints (one per text), got {got}")
    for i, v in enumerate(labels):
        if not is_int(v) or v < 0 or (num_labels is not None and v >= num_labels):
            top = f"{num_labels - 1}" if num_labels is not None else "inf"
            raise DataError(f"{name}[{i}] must be an int in [0, {top}], got {v!r}")
    return [int(v) for v in labels]
