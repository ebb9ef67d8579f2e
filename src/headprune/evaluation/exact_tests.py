"""The closed-form paired tests (scipy): McNemar's exact and mid-p tests with the mid-p interval, the
paper's paired t-test, and Pearson's r. :mod:`headprune.evaluation.significance` picks which one is reported."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import DataError
from ..extras import require
from .resampling import check_alpha

scipy_stats = require("scipy.stats", "significance tests")

CI_ALPHA = 0.05  # the printed interval is the 95% interval of the reported test


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
class McNemarMidPResult:
    """McNemar's mid-p test and its interval of delta = (only_b - only_a) / n.

    p_value: 2 * min(P(X < x) + P(X = x) / 2, P(X > x) + P(X = x) / 2), X ~ Bin(only_a + only_b, 1/2),
    x = only_b (capped at 1). ci_low/ci_high: the mid-p Clopper-Pearson interval of the discordant share
    pi at ``ci_alpha``, mapped to delta = (only_a + only_b) (2 pi - 1) / n: it excludes 0 exactly when
    p_value < ci_alpha (both are the mid-p tail at pi = 1/2).
    """

    only_a: int
    only_b: int
    delta: float
    p_value: float
    ci_low: float
    ci_high: float
    n: int
    ci_alpha: float = CI_ALPHA

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


def paired_arrays(a: Any, b: Any, names: tuple[str, str], dtype: Any = float) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=dtype), np.asarray(b, dtype=dtype)
    if a.ndim == 0 or a.shape != b.shape or len(a) == 0:
        raise DataError(
            f"{names[0]} and {names[1]} must be non-empty arrays of the same shape [n, ...]; "
            f"got shapes {a.shape} and {b.shape}"
        )
    return a, b


def binary_outcomes(correct_a: Any, correct_b: Any) -> tuple[np.ndarray, np.ndarray]:
    a, b = paired_arrays(correct_a, correct_b, ("correct_a", "correct_b"))
    if a.ndim != 1 or not np.isin(a, (0, 1)).all() or not np.isin(b, (0, 1)).all():
        raise DataError("correct_a and correct_b must be 1-D arrays of 0/1 (or bool) outcomes per example")
    return a, b


def mcnemar_exact(correct_a: Any, correct_b: Any) -> McNemarResult:
    """McNemar's exact test of paired 0/1 outcomes [n]: scipy's two-sided binomtest(only_b, discordant, 0.5)."""
    a, b = binary_outcomes(correct_a, correct_b)
    only_a, only_b = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    if only_a + only_b == 0:
        return McNemarResult(0, 0, 1.0, len(a))
    p = scipy_stats.binomtest(only_b, only_a + only_b, 0.5, alternative="two-sided").pvalue
    return McNemarResult(only_a, only_b, float(min(1.0, p)), len(a))


def midp_tails(x: int, d: int, pi: float) -> tuple[float, float]:
    """(P(X < x) + P(X = x)/2, P(X > x) + P(X = x)/2) for X ~ Bin(d, pi)."""
    half = 0.5 * scipy_stats.binom.pmf(x, d, pi)
    return float(scipy_stats.binom.cdf(x - 1, d, pi) + half), float(scipy_stats.binom.sf(x, d, pi) + half)


def mcnemar_midp_p(only_a: Any, only_b: Any) -> Any:
    """McNemar mid-p of discordant counts (scalars or arrays, vectorised for simulation); 1 where none."""
    only_a, only_b = np.asarray(only_a), np.asarray(only_b)
    d = only_a + only_b
    half = 0.5 * scipy_stats.binom.pmf(only_b, d, 0.5)
    lower = scipy_stats.binom.cdf(only_b - 1, d, 0.5) + half
    upper = scipy_stats.binom.sf(only_b, d, 0.5) + half
    p = np.where(d == 0, 1.0, np.minimum(1.0, 2 * np.minimum(lower, upper)))
    return float(p) if p.ndim == 0 else p


def mcnemar_midp(correct_a: Any, correct_b: Any, *, ci_alpha: float = CI_ALPHA) -> McNemarMidPResult:
    """McNemar's mid-p test of paired 0/1 outcomes [n] and its interval of the accuracy difference.

    Conditional on the d = only_a + only_b discordant pairs, only_b ~ Bin(d, pi) with pi = 1/2 under the
    null. The interval inverts the same mid-p tails in pi (root of tail(pi) = ci_alpha / 2 on each side)
    and maps pi to delta = d (2 pi - 1) / n.
    """
    from scipy.optimize import brentq

    check_alpha(ci_alpha, "ci_alpha")
    a, b = binary_outcomes(correct_a, correct_b)
    n = len(a)
    only_a, only_b = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    d = only_a + only_b
    delta = (only_b - only_a) / n
    if d == 0:
        return McNemarMidPResult(0, 0, 0.0, 1.0, 0.0, 0.0, n, ci_alpha)
    target = ci_alpha / 2
    # upper tail P(X > x) + P(X = x)/2 rises with pi; lower tail falls
    lo = 0.0 if only_b == 0 else brentq(lambda pi: midp_tails(only_b, d, pi)[1] - target, 0.0, 1.0, xtol=1e-14)
    hi = 1.0 if only_b == d else brentq(lambda pi: midp_tails(only_b, d, pi)[0] - target, 0.0, 1.0, xtol=1e-14)
    return McNemarMidPResult(only_a, only_b, delta, mcnemar_midp_p(only_a, only_b),
                             d * (2 * lo - 1) / n, d * (2 * hi - 1) / n, n, ci_alpha)


def paired_ttest(a: Any, b: Any) -> TTestResult:
    """Paired two-sided t-test (scipy_stats.ttest_rel) of per-example scores b against a [n].

    All differences zero: statistic 0.0 and p 1.0 (scipy gives nan).
    """
    a, b = paired_arrays(a, b, ("a", "b"))
    if a.ndim != 1 or len(a) < 2:
        raise DataError(f"a and b must be 1-D with at least 2 examples; got shape {a.shape}")
    mean_a, mean_b = float(a.mean()), float(b.mean())
    if np.all(a == b):
        return TTestResult(0.0, 1.0, mean_a, mean_b, 0.0, len(a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant differences: scipy warns, returns +-inf and p = 0
        res = scipy_stats.ttest_rel(b, a)
    return TTestResult(float(res.statistic), float(res.pvalue), mean_a, mean_b, mean_b - mean_a, len(a))


def pearson(x: Any, y: Any) -> PearsonResult:
    """Pearson r and two-sided p (scipy_stats.pearsonr) of paired values [n]; nan, nan if one is constant."""
    x, y = paired_arrays(x, y, ("x", "y"))
    if x.ndim != 1 or len(x) < 2:
        raise DataError(f"x and y must be 1-D with at least 2 values; got shape {x.shape}")
    if np.all(x == x[0]) or np.all(y == y[0]):
        return PearsonResult(float("nan"), float("nan"), len(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nearly-constant input warnings; the numbers are still returned
        res = scipy_stats.pearsonr(x, y)
    return PearsonResult(float(res.statistic), float(res.pvalue), len(x))
