"""Is a difference significant? Paired bootstrap (BLEU, accuracy, F1, Matthews, perplexity), paired
t-test, McNemar's exact test, Pearson r, and :func:`compare`, which picks the tests for two
evaluations of the same examples. Every p-value here is two-sided.

Convention: system `a` is the baseline (e.g. the full model), `b` the variant (e.g. one head ablated);
every `delta` is `score_b - score_a`. Needs scipy (the ``study`` extra).

:func:`compare` dispatches on the metric: accuracy -> the paper's paired t-test on per-example
correctness (the reported ``p_value``), McNemar's exact test on the discordant pairs beside it, and a
paired bootstrap for the 95% interval; F1 / Matthews -> paired bootstrap of the corpus metric; BLEU ->
paired bootstrap of corpus BLEU from sentence statistics; perplexity -> paired bootstrap of corpus
perplexity from per-block NLL sums. The bootstrap p-value is sacreBLEU's paired-bootstrap p-value
(:func:`centred_p_value`), for every corpus metric.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, DataError
from ..extras import require
from .base import EvalResult
from .metrics import CLASSIFICATION_METRICS, bleu_from_stats, bleu_scorer, bleu_statistics, labels_array

scipy_stats = require("scipy.stats", "significance tests")

SACREBLEU_SEED = 12345  # sacrebleu's default SACREBLEU_SEED: same seed -> same resamples as `sacrebleu --paired-bs`


@dataclass(frozen=True)
class BootstrapResult:
    """Paired bootstrap of a corpus metric over n examples.

    p_value: two-sided, sacreBLEU's paired-bootstrap p-value (:func:`centred_p_value`) of the resampled
    deltas delta_i = score_b_i - score_a_i; 1.0 when delta == 0.
    ci_low/ci_high: 95% percentile interval of delta (2.5% and 97.5% quantiles, numpy 'linear', of delta_i).
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
    """BootstrapResult for BLEU, plus sacreBLEU's signature (p_value equals sacreBLEU's ``PairedTest``)."""

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
class McNemarResult:
    """McNemar's exact test: two-sided binomial test of the discordant pairs against 1/2."""

    only_a: int  # examples a gets right and b wrong
    only_b: int  # examples b gets right and a wrong
    p_value: float  # 1.0 when there is no discordant pair
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


# ---------------------------------------------------------------- paired bootstrap


def centred_p_value(diffs: np.ndarray, delta: float) -> float:
    """sacreBLEU's paired-bootstrap p-value (after Moses and multeval), two-sided.

    diffs [n_resamples]: resampled deltas; delta: the observed one. The test statistic |delta_i| is
    centred on its resampling mean (the bootstrap distribution under the null of no difference):
    p = (1 + #{|delta_i| - mean_j |delta_j| > |delta|}) / (n_resamples + 1).
    Equal to ``sacrebleu.compat``'s ``PairedTest(test_type='bs')`` for the same resamples. One
    deliberate difference: p = 1.0 when delta == 0 (sacreBLEU gives 1 / (n_resamples + 1) for two
    identical systems, which would call a no-op significant).
    """
    if delta == 0:
        return 1.0
    sample = np.abs(np.asarray(diffs, dtype=np.float64))
    extreme = int(np.sum(sample - sample.mean() > abs(delta)))
    return float((extreme + 1) / (len(sample) + 1))


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
    p_value = centred_p_value(diffs, delta)
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
    preds_a, preds_b, labels = labels_array(preds_a, "preds_a"), labels_array(preds_b, "preds_b"), labels_array(labels, "labels")
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


def paired_bootstrap_bleu(
    hyps_a: Sequence[str], hyps_b: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], *,
    n_resamples: int = 1000, seed: int | None = SACREBLEU_SEED, tokenize: str = "13a", lowercase: bool = False,
    force: bool = False,
) -> BleuBootstrapResult:
    """Paired bootstrap of corpus BLEU (sacrebleu), resampling sentence-level sufficient statistics.

    With the same seed (default: sacrebleu's 12345) the resamples are those of sacrebleu's
    `PairedTest(test_type='bs')`, so scores, resample means and `p_value` match it.
    """
    _check_resamples(n_resamples, seed)
    if len(hyps_a) != len(hyps_b):
        raise DataError(f"hyps_a has {len(hyps_a)} sentences but hyps_b has {len(hyps_b)}")
    stats_a, bleu = bleu_statistics(hyps_a, refs, tokenize=tokenize, lowercase=lowercase, force=force)
    stats_b, _ = bleu_statistics(hyps_b, refs, tokenize=tokenize, lowercase=lowercase, force=force)
    result, scores_a, scores_b = _bootstrap(stats_a, stats_b, bleu_scorer(bleu), n_resamples, seed, "sum")
    signature = bleu.get_signature()
    signature.update("bs", n_resamples)
    signature.update("seed", str(seed).lower())
    return BleuBootstrapResult(**asdict(result), signature=signature.format())


# ---------------------------------------------------------------- t-test and correlation


def paired_ttest(a: Any, b: Any) -> TTestResult:
    """Paired two-sided t-test (scipy_stats.ttest_rel) of per-example scores b against a [n].

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
        res = scipy_stats.ttest_rel(b, a)
    return TTestResult(float(res.statistic), float(res.pvalue), mean_a, mean_b, mean_b - mean_a, len(a))


def mcnemar_exact(correct_a: Any, correct_b: Any) -> McNemarResult:
    """McNemar's exact test of paired 0/1 outcomes [n]: scipy's two-sided binomtest(only_b, discordant, 0.5)."""
    a, b = _paired_arrays(correct_a, correct_b, ("correct_a", "correct_b"))
    if a.ndim != 1 or not np.isin(a, (0, 1)).all() or not np.isin(b, (0, 1)).all():
        raise DataError("correct_a and correct_b must be 1-D arrays of 0/1 (or bool) outcomes per example")
    only_a, only_b = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    if only_a + only_b == 0:
        return McNemarResult(0, 0, 1.0, len(a))
    p = scipy_stats.binomtest(only_b, only_a + only_b, 0.5, alternative="two-sided").pvalue
    return McNemarResult(only_a, only_b, float(min(1.0, p)), len(a))


def pearson(x: Any, y: Any) -> PearsonResult:
    """Pearson r and two-sided p (scipy_stats.pearsonr) of paired values [n]; nan, nan if one is constant."""
    x, y = _paired_arrays(x, y, ("x", "y"))
    if x.ndim != 1 or len(x) < 2:
        raise DataError(f"x and y must be 1-D with at least 2 values; got shape {x.shape}")
    if np.all(x == x[0]) or np.all(y == y[0]):
        return PearsonResult(float("nan"), float("nan"), len(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nearly-constant input warnings; the numbers are still returned
        res = scipy_stats.pearsonr(x, y)
    return PearsonResult(float(res.statistic), float(res.pvalue), len(x))


# ---------------------------------------------------------------- two evaluations


def compare(base: EvalResult, other: EvalResult, *, n_resamples: int = 1000, seed: int = 0) -> dict:
    """Tests of ``other`` against ``base`` (same examples), all two-sided.

    Returns {"test": name of the reported test, "p_value": its p, "ci_low", "ci_high": 95% bootstrap
    interval of delta, "p_bootstrap", and for accuracy "p_ttest" (= p_value, the paper's test) and
    "p_mcnemar"}.
    """
    if base.n != other.n or base.metric != other.metric:
        raise ConfigError(f"cannot compare {base.metric} on {base.n} examples with {other.metric} on {other.n}")
    a, b = base.per_example, other.per_example
    if base.metric == "accuracy" and "correct" in a:
        t = paired_ttest(a["correct"], b["correct"])
        boot = paired_bootstrap_accuracy(a["correct"], b["correct"], n_resamples=n_resamples, seed=seed)
        return {"test": "paired t-test (per-example correctness)", "p_value": t.p_value, "p_ttest": t.p_value,
                "p_mcnemar": mcnemar_exact(a["correct"], b["correct"]).p_value, "p_bootstrap": boot.p_value,
                "ci_low": boot.ci_low, "ci_high": boot.ci_high}
    if base.metric in ("f1", "matthews") and "pred" in a:
        boot = paired_bootstrap_classification(a["pred"], b["pred"], a["label"], metric=base.metric,
                                                     n_resamples=n_resamples, seed=seed)
        return _boot("paired bootstrap", boot)
    if base.metric == "bleu" and "bleu_stats" in a:
        boot = paired_bootstrap(a["bleu_stats"], b["bleu_stats"], bleu_from_stats, n_resamples=n_resamples,
                                      seed=seed, reduce="sum")
        return _boot("paired bootstrap (corpus BLEU)", boot)
    if base.metric in ("perplexity", "nll") and "nll_sum" in a:
        sa = np.stack([a["nll_sum"], a["tokens"]], axis=1)
        sb = np.stack([b["nll_sum"], b["tokens"]], axis=1)
        corpus = (lambda s: math.exp(s[0] / s[1])) if base.metric == "perplexity" else (lambda s: s[0] / s[1])
        boot = paired_bootstrap(sa, sb, corpus, n_resamples=n_resamples, seed=seed, reduce="sum")
        return _boot(f"paired bootstrap (corpus {base.metric})", boot)
    raise ConfigError(f"no significance test for metric {base.metric!r}; "
                      "allowed: accuracy, f1, matthews, bleu, perplexity, nll")


def _boot(name: str, boot) -> dict:
    return {"test": name, "p_value": boot.p_value, "p_bootstrap": boot.p_value, "ci_low": boot.ci_low,
            "ci_high": boot.ci_high}
