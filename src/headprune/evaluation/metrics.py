"""Metrics: accuracy, F1, Matthews from a confusion matrix; corpus BLEU from sentence statistics
(sacreBLEU's own computation); perplexity from NLL sums; and how each is printed.

Needs numpy only, except BLEU, which needs sacrebleu (the ``study`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from ..extras import require

PERCENT_METRICS = ("accuracy", "f1", "matthews")  # printed x 100
BLEU_STATS = ("sys_len", "ref_len", "correct_1", "correct_2", "correct_3", "correct_4",
              "total_1", "total_2", "total_3", "total_4")  # one row [10] per sentence


def format_score(metric: str, value: float) -> str:
    """A score as tables and reports print it: accuracy/F1/Matthews x 100, others as they are, 2 decimals."""
    return f"{value * 100:.2f}" if metric in PERCENT_METRICS else f"{value:.2f}"


def labels_array(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer) or (arr.size and arr.min() < 0):
        raise DataError(f"{name} must be a 1-D array of non-negative int class ids; got dtype {arr.dtype}, "
                        f"shape {arr.shape}")
    return arr


# ---------------------------------------------------------------- metrics


def confusion_matrix(preds: Any, labels: Any, num_classes: int | None = None) -> np.ndarray:
    """counts[label, pred] as int64 array [num_classes, num_classes]."""
    preds, labels = labels_array(preds, "preds"), labels_array(labels, "labels")
    if preds.shape != labels.shape:
        raise DataError(f"preds has {len(preds)} entries but labels has {len(labels)}")
    k = int(max(preds.max(initial=0), labels.max(initial=0)) + 1)
    if num_classes is not None:
        if num_classes < k:
            raise DataError(f"num_classes={num_classes} but preds/labels hold class id {k - 1}")
        k = num_classes
    return np.bincount(labels * k + preds, minlength=k * k).reshape(k, k)


def accuracy_from_confusion(counts: np.ndarray) -> float:
    total = counts.sum()
    return float(np.trace(counts) / total) if total else 0.0


def f1_from_confusion(counts: np.ndarray, positive: int = 1) -> float:
    """F1 of class `positive` (all other classes negative); 0.0 when there is no positive at all."""
    if positive >= len(counts):
        return 0.0
    tp = counts[positive, positive]
    fp, fn = counts[:, positive].sum() - tp, counts[positive, :].sum() - tp
    return float(2 * tp / (2 * tp + fp + fn)) if tp + fp + fn else 0.0


def matthews_from_confusion(counts: np.ndarray) -> float:
    """Multi-class Matthews correlation (Gorodkin 2004, as sklearn); 0.0 when undefined (constant)."""
    counts = counts.astype(np.float64)
    t, p = counts.sum(axis=1), counts.sum(axis=0)  # true / predicted per class
    c, s = np.trace(counts), counts.sum()
    cov_tp, cov_pp, cov_tt = c * s - t @ p, s * s - p @ p, s * s - t @ t
    return float(cov_tp / np.sqrt(cov_tt * cov_pp)) if cov_tt * cov_pp > 0 else 0.0


def accuracy(preds: Any, labels: Any) -> float:
    """Share of preds equal to labels, int arrays [n]."""
    return accuracy_from_confusion(confusion_matrix(preds, labels))


def f1_binary(preds: Any, labels: Any, positive: int = 1) -> float:
    """F1 of class `positive` (MRPC convention), int arrays [n]."""
    return f1_from_confusion(confusion_matrix(preds, labels), positive)


def matthews_corrcoef(preds: Any, labels: Any) -> float:
    """Matthews correlation (CoLA convention), int arrays [n]."""
    return matthews_from_confusion(confusion_matrix(preds, labels))


CLASSIFICATION_METRICS: dict[str, Callable[[np.ndarray], float]] = {
    "accuracy": accuracy_from_confusion,
    "f1": f1_from_confusion,
    "matthews": matthews_from_confusion,
}


# ---------------------------------------------------------------- BLEU


def bleu_statistics(
    hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], *, tokenize: str = "13a",
    lowercase: bool = False, force: bool = False,
) -> tuple[np.ndarray, Any]:
    """Sentence-level BLEU sufficient statistics [n, 2 + 2 * 4] (sys_len, ref_len, correct[4], total[4])
    and the sacrebleu `BLEU` object that made them. `refs`: one reference per sentence, or sacrebleu's
    list of reference streams."""
    BLEU = require("sacrebleu.metrics", "BLEU").BLEU

    streams = [list(refs)] if len(refs) and isinstance(refs[0], str) else [list(r) for r in refs]
    if not hyps or any(len(s) != len(hyps) for s in streams):
        raise DataError(f"hyps has {len(hyps)} sentences but the references have {[len(s) for s in streams]}; "
                        "they must be equal and non-zero")
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase, force=force)
    # sacrebleu's own PairedTest and sentence_score use this method (stable since 2.0); a test pins that
    # its column sums equal the public corpus_score counts
    rows = bleu._extract_corpus_statistics(list(hyps), streams)
    return np.asarray(rows, dtype=np.float64), bleu


def bleu_scorer(bleu: Any) -> Callable[[np.ndarray], float]:
    """Corpus BLEU of summed sentence statistics [10], computed by the sacrebleu ``BLEU`` object ``bleu``."""
    order = bleu.max_ngram_order

    def score(sums: np.ndarray) -> float:
        ints = [int(round(x)) for x in sums]  # exact integer counts, fresh lists (add-k smoothing edits them)
        return float(bleu.compute_bleu(
            correct=ints[2:2 + order], total=ints[2 + order:], sys_len=ints[0], ref_len=ints[1],
            smooth_method=bleu.smooth_method, smooth_value=bleu.smooth_value,
            effective_order=bleu.effective_order, max_ngram_order=order,
        ).score)

    return score


def bleu_from_stats(stats: Any) -> float:
    """Corpus BLEU (sacrebleu defaults: exp smoothing, 4-grams) from ``bleu_stats`` rows [n, 10] or their sum [10].

    ``paired_bootstrap(a.per_example["bleu_stats"], b.per_example["bleu_stats"], bleu_from_stats)``.
    """
    BLEU = require("sacrebleu.metrics", "BLEU").BLEU

    arr = np.asarray(stats, dtype=np.float64)
    if arr.shape[-1:] != (len(BLEU_STATS),) or arr.ndim not in (1, 2):
        raise DataError(f"stats has shape {arr.shape}; allowed: [n, {len(BLEU_STATS)}] or [{len(BLEU_STATS)}]")
    return bleu_scorer(BLEU())(arr.sum(0) if arr.ndim == 2 else arr)


def perplexity(nll_sum: np.ndarray, tokens: np.ndarray) -> float:
    return float(math.exp(nll_sum.sum() / tokens.sum()))
