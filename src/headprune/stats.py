"""Significance tests and metrics: paired bootstrap (BLEU, accuracy, F1, Matthews), paired t-test, Pearson r.

Convention: system `a` is the baseline (e.g. the full model), `b` the variant (e.g. one head ablated);
every `delta` is `score_b - score_a`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import scipy.stats

from headprune.errors import ConfigError, DataError

SACREBLEU_SEED = 12345  # sacrebleu's default SACREBLEU_SEED: same seed -> same resamples as `sacrebleu --paired-bs`


@dataclass(frozen=True)
class BootstrapResult:
    """Paired bootstrap of a corpus metric over n examples.

    p_value (Koehn 2004, as in compare-mt): the share of resamples in which delta_i = score_b_i - score_a_i
    does not have the observed delta's sign (a tie delta_i == 0 counts as not); 1.0 when delta == 0.
    It is one-sided in the observed direction: "how often would b not beat a (or a not beat b)".
    ci_low/ci_high: 2.5% and 97.5% quantiles (numpy 'linear') of the resampled deltas.
    """

    score_a: float  # metric on all n examples
    score_b: float
    delta: float  # score_b - score_a
    p_value: float
    ci_low: float
    ci_high: float
    mean_a: float  # mean of the resampled scores
    mean_b: float
    n: int
    n_resamples: int
    seed: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BleuBootstrapResult(BootstrapResult):
    """BootstrapResult for BLEU, plus sacrebleu's signature and sacrebleu's own p-value.

    p_value_sacrebleu: sacrebleu's paired-bs definition (after Moses/multeval): centred absolute
    differences, (1 + #{|d_i| - mean|d| > |delta|}) / (n_resamples + 1). Two-sided; note that it gives
    1 / (n_resamples + 1), not 1, for two identical systems.
    """

    p_value_sacrebleu: float
    signature: str  # e.g. nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0


@dataclass(frozen=True)
class TTestResult:
    """Two-sided paired t-test of b against a (statistic > 0: b higher)."""

    statistic: float
    p_value: float
    mean_a: float
    mean_b: float
    delta: float  # mean_b - mean_a
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PearsonResult:
    """Pearson r with its two-sided p-value; unpacks as `r, p = pearson(x, y)`."""

    r: float
    p_value: float
    n: int

    def __iter__(self) -> Iterator[float]:
        return iter((self.r, self.p_value))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- validation helpers


def _check_resamples(n_resamples: int, seed: int | None) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int | np.integer) or n_resamples < 1:
        raise ConfigError(f"n_resamples={n_resamples!r} must be a positive int (1000 in the paper)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0):
        raise ConfigError(f"seed={seed!r} must be a non-negative int, or None for an unseeded run")


def _paired_arrays(a: Any, b: Any, names: tuple[str, str], dtype: Any = float) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=dtype), np.asarray(b, dtype=dtype)
    if a.ndim == 0 or a.shape != b.shape or len(a) == 0:
        raise DataError(
            f"{names[0]} and {names[1]} must be non-empty arrays of the same shape [n, ...]; "
            f"got shapes {a.shape} and {b.shape}"
        )
    return a, b


def _labels(x: Any, name: str) -> np.ndarray:
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
    preds, labels = _labels(preds, "preds"), _labels(labels, "labels")
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


# ---------------------------------------------------------------- paired bootstrap


def bootstrap_indices(n: int, n_resamples: int, seed: int | None) -> np.ndarray:
    """Resample indices [n_resamples, n]; the same draw as sacrebleu's paired bootstrap for equal seeds."""
    return np.random.default_rng(seed).choice(n, size=(n_resamples, n), replace=True)


def resample_scores(
    stats: np.ndarray, metric: Callable[[np.ndarray], float], indices: np.ndarray,
    reduce: Literal["sum", "rows"] = "sum",
) -> np.ndarray:
    """metric of each resample -> [n_resamples]. reduce='sum': metric(stats[idx].sum(0)); 'rows': metric(stats[idx])."""
    if reduce == "rows":
        return np.array([metric(stats[idx]) for idx in indices], dtype=np.float64)
    flat = stats.reshape(len(stats), -1)  # [n, k]
    chunk = max(1, 2**21 // max(1, flat.size))  # resamples per gather, ~16 MB of float64
    out = []
    for start in range(0, len(indices), chunk):
        sums = flat[indices[start:start + chunk]].sum(axis=1)  # [chunk, k]
        out.extend(metric(s.reshape(stats.shape[1:])) for s in sums)
    return np.asarray(out, dtype=np.float64)


def paired_bootstrap(
    stats_a: Any, stats_b: Any, metric: Callable[[np.ndarray], float], *, n_resamples: int = 1000,
    seed: int | None = 0, reduce: Literal["sum", "rows"] = "sum",
) -> BootstrapResult:
    """Paired bootstrap of a corpus metric from per-example statistics arrays [n, ...].

    Each resample draws n example indices with replacement, shared by a and b. With reduce='sum' the
    metric sees the statistics summed over the drawn examples (shape [...], e.g. BLEU counts, number
    correct); with reduce='rows' it sees the drawn rows [n, ...] (e.g. (pred, label) pairs).
    """
    _check_resamples(n_resamples, seed)
    if reduce not in ("sum", "rows"):
        raise ConfigError(f"reduce={reduce!r} must be 'sum' or 'rows'")
    stats_a, stats_b = _paired_arrays(stats_a, stats_b, ("stats_a", "stats_b"))
    return _bootstrap(stats_a, stats_b, metric, n_resamples, seed, reduce)[0]


def _bootstrap(stats_a: np.ndarray, stats_b: np.ndarray, metric: Callable[[np.ndarray], float],
               n_resamples: int, seed: int | None, reduce: str) -> tuple[BootstrapResult, np.ndarray, np.ndarray]:
    whole = (lambda s: metric(s.sum(axis=0))) if reduce == "sum" else metric
    score_a, score_b = float(whole(stats_a)), float(whole(stats_b))
    indices = bootstrap_indices(len(stats_a), n_resamples, seed)
    scores_a = resample_scores(stats_a, metric, indices, reduce)  # type: ignore[arg-type]
    scores_b = resample_scores(stats_b, metric, indices, reduce)  # type: ignore[arg-type]
    diffs = scores_b - scores_a
    delta = score_b - score_a
    p_value = 1.0 if delta == 0 else float(np.mean(np.sign(diffs) != np.sign(delta)))
    low, high = np.quantile(diffs, [0.025, 0.975])
    result = BootstrapResult(
        score_a, score_b, delta, p_value, float(low), float(high), float(scores_a.mean()),
        float(scores_b.mean()), len(stats_a), n_resamples, None if seed is None else int(seed),
    )
    return result, scores_a, scores_b


def paired_bootstrap_accuracy(
    correct_a: Any, correct_b: Any, *, n_resamples: int = 1000, seed: int | None = 0
) -> BootstrapResult:
    """Paired bootstrap of accuracy (a fraction in [0, 1]) from 0/1 outcomes per example [n]."""
    a, b = _paired_arrays(correct_a, correct_b, ("correct_a", "correct_b"))
    if a.ndim != 1 or not np.isin(a, (0, 1)).all() or not np.isin(b, (0, 1)).all():
        raise DataError("correct_a and correct_b must be 1-D arrays of 0/1 (or bool) outcomes per example")
    n = len(a)
    return paired_bootstrap(a, b, lambda total: float(total) / n, n_resamples=n_resamples, seed=seed)


def paired_bootstrap_classification(
    preds_a: Any, preds_b: Any, labels: Any, *,
    metric: Literal["accuracy", "f1", "matthews"] | Callable[[np.ndarray, np.ndarray], float] = "accuracy",
    n_resamples: int = 1000, seed: int | None = 0,
) -> BootstrapResult:
    """Paired bootstrap of a classification metric from int predictions and labels [n].

    Named metrics resample confusion-matrix counts (fast); a callable `metric(preds, labels)` sees the
    drawn rows. 'f1' is the F1 of class 1 (MRPC), 'matthews' the Matthews correlation (CoLA).
    """
    preds_a, preds_b, labels = _labels(preds_a, "preds_a"), _labels(preds_b, "preds_b"), _labels(labels, "labels")
    if not len(preds_a) == len(preds_b) == len(labels) > 0:
        raise DataError(f"preds_a, preds_b and labels must have the same non-zero length; got "
                        f"{len(preds_a)}, {len(preds_b)}, {len(labels)}")
    if callable(metric):
        fn = metric
        return paired_bootstrap(
            np.stack([preds_a, labels], axis=1), np.stack([preds_b, labels], axis=1),
            lambda rows: float(fn(rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64))),
            n_resamples=n_resamples, seed=seed, reduce="rows",
        )
    if metric not in CLASSIFICATION_METRICS:
        raise ConfigError(f"metric={metric!r} must be one of {sorted(CLASSIFICATION_METRICS)} or a callable")
    k = int(max(preds_a.max(), preds_b.max(), labels.max()) + 1)
    eye = np.eye(k * k, dtype=np.float64)  # one-hot of the (label, pred) cell; summing gives the confusion
    on_counts = CLASSIFICATION_METRICS[metric]
    return paired_bootstrap(
        eye[labels * k + preds_a], eye[labels * k + preds_b], lambda c: on_counts(c.reshape(k, k)),
        n_resamples=n_resamples, seed=seed,
    )


# ---------------------------------------------------------------- BLEU


def bleu_statistics(
    hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], *, tokenize: str = "13a",
    lowercase: bool = False, force: bool = False,
) -> tuple[np.ndarray, Any]:
    """Sentence-level BLEU sufficient statistics [n, 2 + 2 * 4] (sys_len, ref_len, correct[4], total[4])
    and the sacrebleu `BLEU` object that made them. `refs`: one reference per sentence, or sacrebleu's
    list of reference streams."""
    from sacrebleu.metrics import BLEU

    streams = [list(refs)] if len(refs) and isinstance(refs[0], str) else [list(r) for r in refs]
    if not hyps or any(len(s) != len(hyps) for s in streams):
        raise DataError(f"hyps has {len(hyps)} sentences but the references have {[len(s) for s in streams]}; "
                        "they must be equal and non-zero")
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase, force=force)
    # sacrebleu's own PairedTest and sentence_score use this method (stable since 2.0); a test pins that
    # its column sums equal the public corpus_score counts
    rows = bleu._extract_corpus_statistics(list(hyps), streams)
    return np.asarray(rows, dtype=np.float64), bleu


def _bleu_from_sums(bleu: Any) -> Callable[[np.ndarray], float]:
    order = bleu.max_ngram_order

    def score(sums: np.ndarray) -> float:
        ints = [int(round(x)) for x in sums]  # exact integer counts, fresh lists (add-k smoothing edits them)
        return float(bleu.compute_bleu(
            correct=ints[2:2 + order], total=ints[2 + order:], sys_len=ints[0], ref_len=ints[1],
            smooth_method=bleu.smooth_method, smooth_value=bleu.smooth_value,
            effective_order=bleu.effective_order, max_ngram_order=order,
        ).score)

    return score


def paired_bootstrap_bleu(
    hyps_a: Sequence[str], hyps_b: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], *,
    n_resamples: int = 1000, seed: int | None = SACREBLEU_SEED, tokenize: str = "13a", lowercase: bool = False,
    force: bool = False,
) -> BleuBootstrapResult:
    """Paired bootstrap of corpus BLEU (sacrebleu), resampling sentence-level sufficient statistics.

    With the same seed (default: sacrebleu's 12345) the resamples are those of sacrebleu's
    `PairedTest(test_type='bs')`, so scores, resample means and `p_value_sacrebleu` match it.
    """
    _check_resamples(n_resamples, seed)
    if len(hyps_a) != len(hyps_b):
        raise DataError(f"hyps_a has {len(hyps_a)} sentences but hyps_b has {len(hyps_b)}")
    stats_a, bleu = bleu_statistics(hyps_a, refs, tokenize=tokenize, lowercase=lowercase, force=force)
    stats_b, _ = bleu_statistics(hyps_b, refs, tokenize=tokenize, lowercase=lowercase, force=force)
    result, scores_a, scores_b = _bootstrap(stats_a, stats_b, _bleu_from_sums(bleu), n_resamples, seed, "sum")
    signature = bleu.get_signature()
    signature.update("bs", n_resamples)
    signature.update("seed", str(seed).lower())
    sample = np.abs(scores_b - scores_a)
    extreme = np.sum(sample - sample.mean() > abs(result.delta))
    return BleuBootstrapResult(
        **asdict(result), p_value_sacrebleu=float((extreme + 1) / (n_resamples + 1)), signature=signature.format(),
    )


# ---------------------------------------------------------------- t-test and correlation


def paired_ttest(a: Any, b: Any) -> TTestResult:
    """Paired two-sided t-test (scipy.stats.ttest_rel) of per-example scores b against a [n].

    All differences zero: statistic 0.0 and p 1.0 (scipy gives nan).
    """
    a, b = _paired_arrays(a, b, ("a", "b"))
    if a.ndim != 1 or len(a) < 2:
        raise DataError(f"a and b must be 1-D with at least 2 examples; got shape {a.shape}")
    mean_a, mean_b = float(a.mean()), float(b.mean())
    if np.all(a == b):
        return TTestResult(0.0, 1.0, mean_a, mean_b, 0.0, len(a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant differences: scipy warns, returns +-inf and p = 0
        res = scipy.stats.ttest_rel(b, a)
    return TTestResult(float(res.statistic), float(res.pvalue), mean_a, mean_b, mean_b - mean_a, len(a))


def pearson(x: Any, y: Any) -> PearsonResult:
    """Pearson r and two-sided p (scipy.stats.pearsonr) of paired values [n]; nan, nan if one is constant."""
    x, y = _paired_arrays(x, y, ("x", "y"))
    if x.ndim != 1 or len(x) < 2:
        raise DataError(f"x and y must be 1-D with at least 2 values; got shape {x.shape}")
    if np.all(x == x[0]) or np.all(y == y[0]):
        return PearsonResult(float("nan"), float("nan"), len(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nearly-constant input warnings; the numbers are still returned
        res = scipy.stats.pearsonr(x, y)
    return PearsonResult(float(res.statistic), float(res.pvalue), len(x))
