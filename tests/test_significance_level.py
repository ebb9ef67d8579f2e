"""The reported tests keep their level: rejection rates under a simulated true null, and intervals that
agree with their p-values. The full simulation (more comparisons, BLEU of real sacrebleu sentence
statistics) is benchmarks/significance_level.py; these sizes run in seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from headprune.errors import ConfigError
from headprune.evaluation.base import EvalResult
from headprune.evaluation.metrics import bleu_scorer
from headprune.evaluation.multiplicity import benjamini_hochberg, holm
from headprune.evaluation.significance import (
    bleu_batch,
    compare,
    critical_value,
    mcnemar_midp,
    mcnemar_midp_p,
    min_resamples,
    paired_bootstrap,
    paired_permutation,
    resamples_for,
    sign_flip_test,
)

N_NULL = 2000  # null comparisons per test


def _within_binomial_error(rejections: int, n: int, alpha: float) -> bool:
    """Rejection count inside the two-sided 99.9% binomial acceptance region of Bin(n, alpha)."""
    low, high = stats.binom.ppf(0.0005, n, alpha), stats.binom.isf(0.0005, n, alpha)
    return low <= rejections <= high


def _result(metric: str, per_example: dict, score: float = 0.0) -> EvalResult:
    n = len(next(iter(per_example.values())))
    return EvalResult(metric=metric, score=score, n=n, per_example=per_example, higher_is_better=True)


# ---------------------------------------------------------------- level under a true null


def test_mcnemar_midp_keeps_its_level():
    """Two exchangeable classifiers on 872 examples (SST-2's size), 10% discordant pairs."""
    rng = np.random.default_rng(0)
    cells = rng.multinomial(872, [0.8, 0.1, 0.05, 0.05], size=20 * N_NULL)  # both right, both wrong, only a, only b
    p = mcnemar_midp_p(cells[:, 2], cells[:, 3])
    for alpha in (0.05, 0.01):
        rejected = int(np.sum(p < alpha))
        assert _within_binomial_error(rejected, len(p), alpha), (alpha, rejected / len(p))
        assert 0.035 <= rejected / len(p) <= 0.065 or alpha != 0.05


def test_sign_flip_keeps_its_level():
    """Skewed real per-example scores (exchangeable pairs -> symmetric differences), 40 examples."""
    rng = np.random.default_rng(1)
    p = []
    for _ in range(N_NULL):
        shared = rng.exponential(1.0, 40)
        a, b = shared + rng.exponential(1.0, 40), shared + rng.exponential(1.0, 40)
        p.append(sign_flip_test(a, b, n_resamples=199, seed=int(rng.integers(2**31))).p_value)
    p = np.asarray(p)
    for alpha in (0.05, 0.01):
        assert _within_binomial_error(int(np.sum(p < alpha)), N_NULL, alpha), (alpha, np.mean(p < alpha))


def _null_bleu_stats(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sentence statistics [n, 10] of two exchangeable systems: per sentence a quality both share."""
    ref_len = rng.integers(5, 30, n)
    quality = rng.beta(4, 3, n)  # per-sentence difficulty, the same for both systems

    def system() -> np.ndarray:
        sys_len = np.maximum(1, ref_len + rng.integers(-3, 4, n))
        total = np.maximum(0, sys_len[:, None] - np.arange(4)[None])  # [n, 4] n-grams of each order
        correct = rng.binomial(total, quality[:, None] ** (1 + np.arange(4))[None])
        return np.column_stack([sys_len, ref_len, correct, total]).astype(np.float64)

    return system(), system()


def test_bootstrap_of_corpus_bleu_keeps_its_level():
    """The reported BLEU test through compare(): approximate randomization of corpus BLEU, 150 sentences;
    the two-sided bootstrap beside it stays at or below its level, sacreBLEU's statistic does not."""
    rng = np.random.default_rng(2)
    p, p_sacrebleu, p_bootstrap = [], [], []
    for i in range(1000):
        a, b = _null_bleu_stats(rng, 150)
        out = compare(_result("bleu", {"bleu_stats": a}), _result("bleu", {"bleu_stats": b}), n_resamples=199, seed=i)
        p.append(out["p_value"])
        p_sacrebleu.append(out["p_sacrebleu"])
        p_bootstrap.append(out["p_bootstrap"])
    p = np.asarray(p)
    for alpha in (0.05, 0.01):
        assert _within_binomial_error(int(np.sum(p < alpha)), len(p), alpha), (alpha, np.mean(p < alpha))
    assert 0.035 <= np.mean(p < 0.05) <= 0.065
    assert np.mean(np.asarray(p_bootstrap) < 0.05) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / len(p))
    assert np.mean(np.asarray(p_sacrebleu) < 0.05) > 0.075  # sacreBLEU's statistic is not a two-sided 5% test


# ---------------------------------------------------------------- interval and p agree


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_each_interval_excludes_zero_exactly_when_its_p_is_below_alpha(alpha):
    rng = np.random.default_rng(3)
    checked = {"boot": 0, "flip": 0, "midp": 0, "perm": 0}
    for i in range(80):
        shift = rng.normal(0, 0.25)
        a = (rng.random(120) < 0.7).astype(float)
        b = np.where(rng.random(120) < 0.2, (rng.random(120) < 0.7 + shift).astype(float), a)
        boot = paired_bootstrap(a, b, lambda s: float(s) / 120, n_resamples=299, seed=i, ci_alpha=alpha)
        flip = sign_flip_test(a + rng.normal(0, 0.1, 120), b, n_resamples=299, seed=i, ci_alpha=alpha)
        mid = mcnemar_midp(a, b, ci_alpha=alpha)
        perm = paired_permutation(a, b, lambda s: float(s) / 120, n_resamples=299, seed=i, ci_alpha=alpha)
        for name, res in [("boot", boot), ("flip", flip), ("midp", mid), ("perm", perm)]:
            excludes = res.ci_low > 0 or res.ci_high < 0
            assert (res.p_value < alpha) == excludes, (name, res)
            checked[name] += excludes
    assert all(3 < v < 77 for v in checked.values()), checked  # both verdicts occur for every test


def test_critical_value_counts_like_the_p_value():
    null = np.array([5.0, 4.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.25, 0.1])  # B = 9, p = (1 + count) / 10
    assert critical_value(null, 0.25) == 4.0  # p < 0.25 needs count <= 1: |delta| > 4 (4 is reached twice)
    assert critical_value(null, 0.15) == 5.0  # count 0 only
    assert critical_value(null, 0.1) == math.inf  # 1/10 is the smallest p: nothing is below 0.1


def test_mcnemar_midp_interval_matches_the_midp_tails():
    res = mcnemar_midp([1] * 30 + [0] * 12 + [1] * 50, [0] * 30 + [1] * 12 + [1] * 50, ci_alpha=0.05)
    d, x = 42, 12
    for bound, tail in [(res.ci_low, lambda pi: stats.binom.sf(x, d, pi)), (res.ci_high, lambda pi: stats.binom.cdf(x - 1, d, pi))]:
        pi = (bound * 92 / d + 1) / 2
        assert tail(pi) + stats.binom.pmf(x, d, pi) / 2 == pytest.approx(0.025, abs=1e-9)
    assert res.delta == pytest.approx((12 - 30) / 92) and res.ci_low < res.delta < res.ci_high


def test_sign_flip_enumerates_like_the_exact_permutation_distribution():
    """With many random sign patterns the p approaches the exact one over all 2^10 patterns."""
    d = np.array([0.3, -0.1, 0.5, 0.2, 0.4, -0.2, 0.6, 0.1, 0.35, 0.25])
    patterns = np.array(np.meshgrid(*[[-1, 1]] * 10)).reshape(10, -1).T  # [1024, 10]
    exact = np.mean(np.abs(patterns @ d) >= abs(d.sum()) - 1e-12)
    res = sign_flip_test(np.zeros(10), d, n_resamples=40000, seed=0)
    assert res.p_value == pytest.approx(exact, abs=4 * math.sqrt(exact / 40000) + 1e-4)


# ---------------------------------------------------------------- resamples for a sweep


@pytest.mark.parametrize(("m", "alpha"), [(1, 0.05), (11, 0.01), (36, 0.01), (72, 0.01), (144, 0.05)])
def test_min_resamples_is_the_fewest_that_can_reject_after_adjustment(m, alpha):
    need = min_resamples(m, alpha)
    for b, can in [(need, True), (need - 1, False)]:
        smallest = np.full(m, 1.0)
        smallest[0] = 1 / (b + 1)  # the best any resampling test can do
        assert (holm(smallest)[0] < alpha) == can and (benjamini_hochberg(smallest)[0] < alpha) == can
    assert resamples_for(m, alpha) >= max(1000, need) and resamples_for(m, alpha, need) == need


def test_too_few_resamples_are_refused_naming_the_minimum():
    need = min_resamples(72, 0.01)
    with pytest.raises(ConfigError, match=rf"n_resamples=300 is too few for 72 tests at alpha=0.01.*>= {need}"):
        resamples_for(72, 0.01, 300)


# ---------------------------------------------------------------- vectorised BLEU


def test_bleu_batch_equals_sacrebleu_on_every_branch():
    from sacrebleu.metrics import BLEU

    rng = np.random.default_rng(4)
    total = rng.integers(0, 40, (300, 4)).astype(float)
    correct = np.floor(total * rng.random((300, 4)) * (rng.random((300, 4)) > 0.2))  # some orders unmatched
    sums = np.column_stack([rng.integers(0, 60, 300), rng.integers(1, 60, 300), correct, total])
    sums[:5, 2:6] = 0  # no match at all
    sums[5:10, 9] = 0  # no 4-gram
    reference = np.array([bleu_scorer(BLEU())(row) for row in sums])
    assert bleu_batch(sums) == pytest.approx(reference, rel=1e-12, abs=1e-12)
    assert (reference == 0).sum() >= 10 and (reference > 0).sum() > 200


def test_confusion_batch_equals_the_one_matrix_metrics():
    from headprune.evaluation.metrics import CLASSIFICATION_METRICS
    from headprune.evaluation.significance import confusion_batch

    rng = np.random.default_rng(5)
    for k in (2, 3):
        counts = rng.integers(0, 30, (200, k, k)).astype(float)
        counts[:3] = 0  # empty
        counts[3:6, :, 0] = 0  # one predicted class missing
        for name, one in CLASSIFICATION_METRICS.items():
            assert confusion_batch(name, k)(counts) == pytest.approx([one(c) for c in counts], abs=1e-12)
