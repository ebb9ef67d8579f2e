"""Multiplicity control over a sweep: adjusted p-values for many tests at once (numpy only).

A sweep tests every head (or every site) against the full model; at alpha = 0.01 and 72 heads about
one head would be "significant" by chance alone. ``holm`` (the default) controls the family-wise
error rate: the chance of calling even one unimportant head important stays below alpha.
``bh`` (Benjamini-Hochberg) controls the false discovery rate: the expected share of wrong calls
among the heads called significant. Both return adjusted p-values [m] in the input order; a test is
significant when its adjusted p is below alpha.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError, DataError

CORRECTIONS = ("holm", "bh")


def _check(p_values: Sequence[float]) -> np.ndarray:
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise DataError(f"p-values must be a 1-D sequence of numbers in [0, 1]; got {p_values!r}")
    return p


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjustment: sorted p_(i) -> max_{j <= i} min(1, (m - j + 1) p_(j)) [m]."""
    p = _check(p_values)
    m = len(p)
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = stepped
    return out


def benjamini_hochberg(p_values: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg step-up adjustment: sorted p_(i) -> min_{j >= i} min(1, m p_(j) / j) [m]."""
    p = _check(p_values)
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    stepped = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    out = np.empty(m)
    out[order] = stepped
    return out


def adjust(p_values: Sequence[float], correction: str = "holm") -> np.ndarray:
    """Adjusted p-values [m] by ``correction`` ('holm' or 'bh')."""
    if correction == "holm":
        return holm(p_values)
    if correction == "bh":
        return benjamini_hochberg(p_values)
    raise ConfigError(f"correction={correction!r}; allowed: {', '.join(CORRECTIONS)}")


def check_correction(correction: str) -> str:
    if correction not in CORRECTIONS:
        raise ConfigError(f"correction={correction!r}; allowed: {', '.join(CORRECTIONS)}")
    return correction


def adjust_rows(rows: list[dict], correction: str, alpha: float) -> list[dict]:
    """Add ``p_adjusted`` (over all ``rows``, from their raw ``p_value``) and ``significant`` (adjusted p < alpha)."""
    if not rows:
        return rows
    adjusted = adjust([r["p_value"] for r in rows], correction)
    for row, q in zip(rows, adjusted, strict=True):
        row["p_adjusted"] = float(q)
        row["significant"] = bool(q < alpha)
    return rows
