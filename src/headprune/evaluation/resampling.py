"""The resampling side of the significance tests (numpy only): how many resamples a sweep needs, the
resampled draws, p-values with the +1 floor and the critical values that turn them into intervals, and
vectorised corpus metrics (BLEU, confusion-matrix metrics) to score many resamples at once.

A resampling p is ``(1 + #{null_j >= |delta|}) / (1 + B)`` for a null distribution of |statistic| of B
draws; :func:`critical_value` is the largest |delta| it does not reject, so the interval
``delta -+ critical_value`` excludes 0 exactly when ``p < alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ConfigError
from .metrics import CLASSIFICATION_METRICS


def check_resamples(n_resamples: int, seed: int | None) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int | np.integer) or n_resamples < 1:
        raise ConfigError(f"n_resamples={n_resamples!r} must be a positive int")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0):
        raise ConfigError(f"seed={seed!r} must be a non-negative int, or None for an unseeded run")


def check_alpha(alpha: float, name: str = "alpha") -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0.0 < alpha < 1.0:
        raise ConfigError(f"{name}={alpha!r}; allowed: 0 < {name} < 1")
    return float(alpha)


# ---------------------------------------------------------------- resamples for a sweep


def min_resamples(m: int, alpha: float) -> int:
    """The fewest resamples B with which one of m tests can be significant after Holm (or BH) at alpha.

    The smallest p of a resampling test is 1 / (B + 1); Holm multiplies the smallest of m p-values by m
    (BH too when only one unit stands out), so a sweep needs m / (B + 1) < alpha.
    """
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 1:
        raise ConfigError(f"m={m!r} (tests in the sweep) must be a positive int")
    alpha = check_alpha(alpha)
    b = max(1, int(math.floor(m / alpha)) - 1)
    while m / (b + 1) >= alpha:  # the same float comparison as `adjusted p < alpha`
        b += 1
    return b


def resamples_for(m: int, alpha: float, n_resamples: int | None = None) -> int:
    """Resamples for a sweep of m tests at alpha: ``n_resamples`` if it is enough (else ConfigError naming
    the minimum), or by default max(1000, 5 m / alpha) -- the smallest adjusted p is then alpha / 5."""
    need = min_resamples(m, alpha)
    if n_resamples is None:
        return max(1000, int(math.ceil(5 * m / alpha)), need)
    check_resamples(n_resamples, None)
    if n_resamples < need:
        raise ConfigError(
            f"n_resamples={n_resamples} is too few for {m} tests at alpha={alpha}: the smallest adjusted p "
            f"would be {m}/{n_resamples + 1} = {m / (n_resamples + 1):.3g} >= alpha, so nothing could be "
            f"significant; allowed: >= {need} (or leave it unset: {resamples_for(m, alpha)})")
    return int(n_resamples)


# ---------------------------------------------------------------- resampling p-values and their intervals


def centred_p_value(diffs: np.ndarray, delta: Any) -> Any:
    """Two-sided centred bootstrap p: (1 + #{|delta_i - mean delta_i| >= |delta|}) / (n_resamples + 1).

    diffs [..., n_resamples]: resampled deltas; delta [...]: the observed ones (batches for simulation).
    The resampled deltas minus their mean are the bootstrap distribution under the null; both tails
    count. Identical systems (every delta 0) give p = 1.
    """
    diffs = np.asarray(diffs, dtype=np.float64)
    null = np.abs(diffs - diffs.mean(axis=-1, keepdims=True))
    return resampling_p_value(null, delta)


def resampling_p_value(null: np.ndarray, delta: Any) -> Any:
    """(1 + #{null_j >= |delta|}) / (1 + B) for a null distribution of |statistic| [..., B]."""
    null = np.asarray(null, dtype=np.float64)
    extreme = np.sum(null >= np.abs(np.asarray(delta, dtype=np.float64))[..., None], axis=-1)
    p = (extreme + 1) / (null.shape[-1] + 1)
    return float(p) if np.ndim(p) == 0 else p


def critical_value(null: np.ndarray, alpha: float) -> float:
    """The largest |delta| that p = (1 + #{null >= |delta|}) / (1 + B) does not reject at alpha.

    null [B]: |statistic| under the null. With K the most resamples at or above |delta| that still give
    p < alpha, p < alpha iff |delta| > the (K+1)-th largest null value; inf when no p can be < alpha.
    """
    null = np.sort(np.asarray(null, dtype=np.float64))[::-1]
    b = len(null)
    ks = np.arange(b + 1)
    allowed = int(np.sum((ks + 1) / (b + 1) < alpha)) - 1  # the same float expression as the p-value
    return math.inf if allowed < 0 else float(null[allowed])


def sacrebleu_p_value(diffs: np.ndarray, delta: float) -> float:
    """sacreBLEU's paired-bootstrap statistic (Moses / multeval): (1 + #{|d_i| - mean|d| > |delta|}) / (B + 1).

    One-tailed in effect (when delta is away from 0 nearly every |d_i| has its sign): about twice the
    nominal rejection rate under a true null. Kept for comparison with ``sacrebleu --paired-bs`` only.
    """
    sample = np.abs(np.asarray(diffs, dtype=np.float64))
    extreme = int(np.sum(sample - sample.mean() > abs(delta)))
    return float((extreme + 1) / (len(sample) + 1))


# ---------------------------------------------------------------- draws


def bootstrap_indices(n: int, n_resamples: int, seed: int | None) -> np.ndarray:
    """Resample indices [n_resamples, n]; the same draw as sacrebleu's paired bootstrap for equal seeds."""
    return np.random.default_rng(seed).choice(n, size=(n_resamples, n), replace=True)


def swap_masks(n: int, n_resamples: int, seed: int | None) -> np.ndarray:
    """Which examples swap their two systems' outcomes, 0/1 [n_resamples, n]."""
    return (np.random.default_rng(seed).random((n_resamples, n)) < 0.5).astype(np.float64)


def sign_flip_signs(n: int, n_resamples: int, seed: int | None) -> np.ndarray:
    """Random signs [n_resamples, n] of the sign-flip test."""
    return np.where(np.random.default_rng(seed).random((n_resamples, n)) < 0.5, -1.0, 1.0)


# ---------------------------------------------------------------- vectorised corpus metrics


def bleu_batch(sums: np.ndarray) -> np.ndarray:
    """Corpus BLEU of many summed statistics rows [m, 10] -> [m], vectorised sacreBLEU ``compute_bleu``
    with its defaults (4-grams, 'exp' smoothing, no effective order); a test holds it to sacrebleu."""
    sums = np.asarray(sums, dtype=np.float64)
    sys_len, ref_len = sums[:, 0], sums[:, 1]
    correct, total = sums[:, 2:6], sums[:, 6:10]  # [m, 4]
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(sys_len < ref_len, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0), 1.0)
        halvings = np.cumsum(correct == 0, axis=1)  # sacreBLEU's smooth_mteval doubles per order with no match
        precision = np.where(correct > 0, 100.0 * correct / total, 100.0 / (2.0 ** halvings * total))
        score = bp * np.exp(np.log(precision).mean(axis=1))
    dead = (correct.sum(axis=1) == 0) | (total == 0).any(axis=1)  # sacreBLEU: no match, or an order with no n-gram
    return np.where(dead, 0.0, score)


def confusion_batch(metric: str, k: int) -> Callable[[np.ndarray], np.ndarray]:
    """``metric`` ('accuracy', 'f1' of class 1, 'matthews') of many confusion matrices [m, k, k] (or their
    flat [m, k*k] sums) -> [m]; the vectorised :data:`CLASSIFICATION_METRICS` (a test holds them equal)."""

    def score(sums: np.ndarray) -> np.ndarray:
        c = np.asarray(sums, dtype=np.float64).reshape(-1, k, k)  # [m, label, pred]
        total = c.sum(axis=(1, 2))
        trace = np.trace(c, axis1=1, axis2=2)
        with np.errstate(divide="ignore", invalid="ignore"):
            if metric == "accuracy":
                return np.where(total > 0, trace / total, 0.0)
            if metric == "f1":
                if k < 2:
                    return np.zeros(len(c))
                tp = c[:, 1, 1]
                fp, fn = c[:, :, 1].sum(axis=1) - tp, c[:, 1, :].sum(axis=1) - tp
                return np.where(tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), 0.0)
            t, pr = c.sum(axis=2), c.sum(axis=1)  # true / predicted per class [m, k]
            cov_tp = trace * total - (t * pr).sum(axis=1)
            cov_pp, cov_tt = total**2 - (pr * pr).sum(axis=1), total**2 - (t * t).sum(axis=1)
            return np.where(cov_tt * cov_pp > 0, cov_tp / np.sqrt(cov_tt * cov_pp), 0.0)

    if metric not in CLASSIFICATION_METRICS:
        raise ConfigError(f"metric={metric!r}; allowed: {sorted(CLASSIFICATION_METRICS)}")
    return score
