"""Golden tables for metrics and tests; paired bootstrap against its definition and against sacrebleu."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sacrebleu
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest, estimate_ci

from headprune.errors import ConfigError, DataError
from headprune.evaluation.metrics import (
    accuracy,
    bleu_scorer,
    bleu_statistics,
    confusion_matrix,
    f1_binary,
    matthews_corrcoef,
)
from headprune.evaluation.significance import (
    SACREBLEU_SEED,
    BootstrapResult,
    bootstrap_indices,
    paired_bootstrap,
    paired_bootstrap_accuracy,
    paired_bootstrap_bleu,
    paired_bootstrap_classification,
    paired_ttest,
    pearson,
    resample_scores,
)

# ---------------------------------------------------------------- golden tables (values from scipy 1.17.1, once)

TTEST_GOLDEN = [
    # a, b, statistic, p  (scipy.stats.ttest_rel(b, a))
    ([0.1, 0.4, 0.35, 0.8, 0.55, 0.2], [0.15, 0.45, 0.3, 0.9, 0.6, 0.25], 2.076136996343499, 0.09251500555042763),
    ([1, 0, 1, 1, 0, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 1, 1, 1, 1, 1], 1.4999999999999998, 0.16785065605707505),
    ([2.0, 3.5, 1.25, 4.0, 5.5], [1.0, 3.0, 1.0, 2.5, 5.0], -3.3541019662496847, 0.028460203254338342),
]

PEARSON_GOLDEN = [
    # x, y, r, p  (scipy.stats.pearsonr)
    ([1, 2, 3, 4, 5], [2, 4, 5, 4, 5], 0.7745966692414835, 0.1240270626575546),
    ([0.5, -1.2, 3.3, 2.2, 0.0, 1.1, -0.7], [1.0, -0.4, 2.9, 2.5, 0.3, 0.8, -1.5], 0.9349748474651183,
     0.0019992100353654766),
    ([1, 2, 3, 4], [4, 3, 2, 1], -1.0, 0.0),
]

CLASSIFICATION_GOLDEN = [
    # preds, labels, accuracy, F1 (class 1), Matthews -- by hand from the confusion matrix
    ([1, 1, 0, 0], [1, 0, 1, 0], 0.5, 0.5, 0.0),  # tp=fp=fn=tn=1
    ([0, 1, 1, 0], [0, 1, 1, 0], 1.0, 1.0, 1.0),  # perfect
    ([1, 0, 0, 1], [0, 1, 1, 0], 0.0, 0.0, -1.0),  # inverted
    ([1, 1, 1, 1], [1, 1, 0, 0], 0.5, 2 / 3, 0.0),  # constant prediction: MCC undefined -> 0
    ([0, 0, 0, 0], [0, 0, 0, 0], 1.0, 0.0, 0.0),  # no positive anywhere: F1 and MCC -> 0
    ([1, 0, 1, 1], [1, 1, 1, 0], 0.5, 2 / 3, -1 / 3),  # sklearn's matthews_corrcoef docstring example
    ([1] * 5 + [1] * 2 + [0] * 1 + [0] * 7, [1] * 5 + [0] * 2 + [1] * 1 + [0] * 7,  # tp 5, fp 2, fn 1, tn 7
     12 / 15, 10 / 13, 33 / math.sqrt(7 * 6 * 9 * 8)),
    ([0, 1, 2, 2, 1, 0], [0, 1, 2, 1, 1, 2], 4 / 6, 4 / 5, 12 / math.sqrt(24 * 22)),  # 3 classes
]


@pytest.mark.parametrize(("a", "b", "statistic", "p"), TTEST_GOLDEN)
def test_paired_ttest_golden(a, b, statistic, p):
    res = paired_ttest(a, b)
    assert res.statistic == pytest.approx(statistic, abs=1e-9)
    assert res.p_value == pytest.approx(p, abs=1e-9)
    assert res.delta == pytest.approx(np.mean(b) - np.mean(a), abs=1e-12)
    assert res.n == len(a) and res.to_dict()["p_value"] == res.p_value


def test_paired_ttest_identical_and_constant_shift():
    same = paired_ttest([0.1, 0.5, 0.9], [0.1, 0.5, 0.9])
    assert (same.statistic, same.p_value, same.delta) == (0.0, 1.0, 0.0)
    shifted = paired_ttest([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])  # zero-variance differences: certain
    assert shifted.statistic == math.inf and shifted.p_value == 0.0


@pytest.mark.parametrize(("x", "y", "r", "p"), PEARSON_GOLDEN)
def test_pearson_golden(x, y, r, p):
    res = pearson(x, y)
    assert res.r == pytest.approx(r, abs=1e-9)
    assert res.p_value == pytest.approx(p, abs=1e-9)
    r2, p2 = res  # unpacks like scipy's (r, p)
    assert (r2, p2) == (res.r, res.p_value) and res.to_dict() == {"r": res.r, "p_value": res.p_value, "n": len(x)}


def test_pearson_constant_input_is_nan():
    res = pearson([1.0, 1.0, 1.0], [0.2, 0.5, 0.1])
    assert math.isnan(res.r) and math.isnan(res.p_value)


@pytest.mark.parametrize(("preds", "labels", "acc", "f1", "mcc"), CLASSIFICATION_GOLDEN)
def test_classification_metrics_golden(preds, labels, acc, f1, mcc):
    preds, labels = np.array(preds), np.array(labels)
    assert accuracy(preds, labels) == pytest.approx(acc, abs=1e-12)
    assert f1_binary(preds, labels) == pytest.approx(f1, abs=1e-12)
    assert matthews_corrcoef(preds, labels) == pytest.approx(mcc, abs=1e-12)
    assert matthews_corrcoef(labels, preds) == pytest.approx(mcc, abs=1e-12)  # symmetric


def test_confusion_matrix_layout():
    counts = confusion_matrix([0, 1, 1, 2], [0, 0, 1, 2], num_classes=4)
    assert counts.shape == (4, 4) and counts[0, 1] == 1 and counts[1, 1] == 1 and counts.sum() == 4
    with pytest.raises(DataError, match="num_classes=2"):
        confusion_matrix([0, 1, 2], [0, 1, 1], num_classes=2)


@pytest.mark.parametrize(("bad", "match"), [
    ([0.5, 1.0], "int class ids"),
    ([[0, 1]], "1-D"),
    ([-1, 0], "non-negative"),
])
def test_metrics_reject_bad_labels(bad, match):
    with pytest.raises(DataError, match=match):
        accuracy(bad, [0, 1])


# ---------------------------------------------------------------- generic bootstrap


def _outcomes(seed: int, n: int, p: float) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) < p).astype(int)


def test_bootstrap_is_deterministic_given_seed():
    a, b = _outcomes(1, 200, 0.7), _outcomes(2, 200, 0.72)
    first = paired_bootstrap_accuracy(a, b, seed=3)
    assert first.to_dict() == paired_bootstrap_accuracy(a, b, seed=3).to_dict()
    other = paired_bootstrap_accuracy(a, b, seed=4)
    assert (other.score_a, other.score_b) == (first.score_a, first.score_b)  # observed scores do not resample
    assert (other.mean_a, other.p_value) != (first.mean_a, first.p_value)


def test_bootstrap_p_value_definition():
    a, b = _outcomes(5, 80, 0.6), _outcomes(6, 80, 0.65)
    res = paired_bootstrap_accuracy(a, b, n_resamples=500, seed=11)
    idx = bootstrap_indices(80, 500, 11)
    diffs = b[idx].mean(axis=1) - a[idx].mean(axis=1)
    assert res.delta == pytest.approx(b.mean() - a.mean())
    # two-sided centred p, written out: (1 + #{|d_i - mean d| >= |delta|}) / (N + 1)
    dev = np.abs(diffs - diffs.mean())
    expected = (1 + np.sum(dev >= abs(res.delta))) / 501
    assert res.p_value == pytest.approx(expected, abs=1e-12) and 0.01 < res.p_value < 1.0
    # sacreBLEU's statistic beside it: (1 + #{|d_i| - mean|d| > |delta|}) / (N + 1)
    sacre = (1 + np.sum(np.abs(diffs) - np.abs(diffs).mean() > abs(res.delta))) / 501
    assert res.p_sacrebleu == pytest.approx(sacre, abs=1e-12)
    # the interval is delta -+ the 25th largest |d_i - mean d| (K = 24 resamples beyond still give p < 0.05)
    half = np.sort(dev)[::-1][24]
    assert (res.ci_low, res.ci_high) == pytest.approx((res.delta - half, res.delta + half), abs=1e-12)
    assert res.mean_a == pytest.approx(a[idx].mean(), abs=1e-12)
    assert res.n == 80 and res.n_resamples == 500 and res.seed == 11


def test_bootstrap_identical_systems():
    a = _outcomes(7, 100, 0.5)
    res = paired_bootstrap_accuracy(a, a.copy())
    assert res.delta == 0.0 and res.p_value == 1.0 and res.ci_low == res.ci_high == 0.0 and res.p_sacrebleu < 0.01


def test_bootstrap_clearly_better_system():
    a = _outcomes(8, 400, 0.6)
    b = a.copy()
    b[np.flatnonzero(a == 0)[::2]] = 1  # fixes half of a's errors, breaks nothing
    res = paired_bootstrap_accuracy(a, b)
    assert res.delta > 0.15 and res.p_value < 0.01 and res.ci_low > 0
    worse = paired_bootstrap_accuracy(b, a)  # the sign flips, the two-sided p-value does not change
    assert worse.delta == -res.delta and worse.p_value == res.p_value and worse.ci_high < 0


def test_classification_bootstrap_paths_agree():
    labels = _outcomes(9, 150, 0.5)
    preds_a = np.where(_outcomes(10, 150, 0.8) == 1, labels, 1 - labels)
    preds_b = np.where(_outcomes(11, 150, 0.85) == 1, labels, 1 - labels)
    by_name = paired_bootstrap_classification(preds_a, preds_b, labels, metric="accuracy", seed=2)
    by_outcome = paired_bootstrap_accuracy(preds_a == labels, preds_b == labels, seed=2)
    assert by_name.to_dict() == pytest.approx(by_outcome.to_dict())
    for name, fn in [("matthews", matthews_corrcoef), ("f1", f1_binary)]:
        named = paired_bootstrap_classification(preds_a, preds_b, labels, metric=name, n_resamples=200, seed=2)
        called = paired_bootstrap_classification(preds_a, preds_b, labels, metric=fn, n_resamples=200, seed=2)
        assert named.to_dict() == pytest.approx(called.to_dict(), abs=1e-12)
        assert named.score_a == pytest.approx(fn(preds_a, labels), abs=1e-12)


def test_generic_bootstrap_rows_and_sum():
    rng = np.random.default_rng(12)
    losses_a, losses_b = rng.random((50, 3)), rng.random((50, 3)) + 0.5
    res = paired_bootstrap(losses_a, losses_b, lambda rows: float(np.median(rows)), reduce="rows", n_resamples=100)
    assert res.score_a == pytest.approx(np.median(losses_a)) and res.p_value < 0.01
    idx = bootstrap_indices(50, 100, 0)
    summed = resample_scores(losses_a, lambda s: float(s[1]), idx)  # metric sees sums of shape [3]
    assert summed == pytest.approx(losses_a[idx, 1].sum(axis=1))


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"n_resamples": 0}, ConfigError, "n_resamples=0"),
    ({"seed": -1}, ConfigError, "seed=-1"),
    ({"reduce": "mean"}, ConfigError, "reduce='mean'"),
])
def test_bootstrap_rejects_bad_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        paired_bootstrap(np.ones(5), np.ones(5), float, **kwargs)


def test_bootstrap_rejects_mismatched_inputs():
    with pytest.raises(DataError, match=r"shapes \(5,\) and \(4,\)"):
        paired_bootstrap(np.ones(5), np.ones(4), float)
    with pytest.raises(DataError, match="0/1"):
        paired_bootstrap_accuracy([0, 2, 1], [0, 1, 1])
    with pytest.raises(DataError, match="same non-zero length"):
        paired_bootstrap_classification([0, 1], [0, 1], [0, 1, 1])
    with pytest.raises(ConfigError, match="metric='auc'"):
        paired_bootstrap_classification([0, 1], [0, 1], [0, 1], metric="auc")


# ---------------------------------------------------------------- BLEU vs sacrebleu


@pytest.fixture(scope="module")
def mt_systems():
    """Two noisy 'systems' of 150 sentences over a 60-word vocabulary; b is somewhat closer to the refs."""
    rng = np.random.default_rng(1)
    vocab = [f"w{i}" for i in range(60)]
    refs = [" ".join(rng.choice(vocab, size=rng.integers(5, 20))) for _ in range(150)]

    def noisy(ref: str, p: float) -> str:
        return " ".join(w if rng.random() > p else str(rng.choice(vocab)) for w in ref.split())

    return [noisy(r, 0.35) for r in refs], [noisy(r, 0.32) for r in refs], refs


def test_bleu_bootstrap_matches_sacrebleu_paired_bs(mt_systems, monkeypatch):
    """Same seed -> same resample indices as sacrebleu's PairedTest(test_type='bs').

    Compared: observed BLEU of both systems (exact), resample means and 95% half-widths of both systems
    (1e-6: sacrebleu sums float32 statistics, we sum exact integers), sacrebleu's p-value (exact) and the
    signature string. sacrebleu takes its seed from SACREBLEU_SEED (default 12345; note that '0' means
    unseeded there), so the env var is pinned.
    """
    hyps_a, hyps_b, refs = mt_systems
    monkeypatch.setenv("SACREBLEU_SEED", str(SACREBLEU_SEED))
    signatures, scores = PairedTest([("a", hyps_a), ("b", hyps_b)], {"BLEU": BLEU()}, [refs], test_type="bs",
                                    n_samples=1000)()
    base, system = scores["BLEU"]
    ours = paired_bootstrap_bleu(hyps_a, hyps_b, refs)
    assert (ours.score_a, ours.score_b) == (base.score, system.score)
    assert ours.mean_a == pytest.approx(base.mean, abs=1e-6) and ours.mean_b == pytest.approx(system.mean, abs=1e-6)
    assert ours.p_sacrebleu == system.p_value  # sacreBLEU's one-tailed statistic, beside ours, exactly
    assert 0.001 < ours.p_sacrebleu < 0.5  # a non-trivial case, not a saturated one
    # the reported two-sided p counts both tails of the same resamples: about twice sacreBLEU's here
    assert ours.p_sacrebleu < ours.p_value < 3 * ours.p_sacrebleu
    swapped = paired_bootstrap_bleu(hyps_b, hyps_a, refs)  # two-sided: the order of the systems does not matter
    assert swapped.delta == -ours.delta and swapped.p_value == pytest.approx(ours.p_value, abs=2 / 1001)
    assert ours.signature == signatures["BLEU"].format()
    stats_a, bleu = bleu_statistics(hyps_a, refs)
    stats_b, _ = bleu_statistics(hyps_b, refs)
    idx = bootstrap_indices(len(refs), 1000, SACREBLEU_SEED)
    for stats, res in [(stats_a, base), (stats_b, system)]:
        mean, half = estimate_ci(resample_scores(stats, bleu_scorer(bleu), idx))
        assert (mean, half) == pytest.approx((res.mean, res.ci), abs=1e-6)


def test_bleu_statistics_sum_to_corpus_score(mt_systems):
    """Pins sacrebleu's (private) per-sentence statistics against its public corpus score."""
    hyps_a, _, refs = mt_systems
    stats, _ = bleu_statistics(hyps_a, refs)
    corpus = sacrebleu.corpus_bleu(hyps_a, [refs])
    sums = stats.sum(axis=0).astype(int).tolist()
    assert stats.shape == (150, 10)
    assert sums == [corpus.sys_len, corpus.ref_len, *corpus.counts, *corpus.totals]


def test_bleu_bootstrap_identical_and_multi_reference(mt_systems):
    hyps_a, hyps_b, refs = mt_systems
    same = paired_bootstrap_bleu(hyps_a, hyps_a, refs, n_resamples=200)
    assert same.delta == 0.0 and same.p_value == 1.0  # sacreBLEU says 1/201: a no-op is not significant
    assert same.p_sacrebleu == pytest.approx(1 / 201)
    two_refs = paired_bootstrap_bleu(hyps_a, hyps_b, [refs, hyps_b], n_resamples=200)
    assert two_refs.signature.startswith("nrefs:2|bs:200|seed:12345|")
    assert two_refs.score_b == pytest.approx(sacrebleu.corpus_bleu(hyps_b, [refs, hyps_b]).score)
    assert isinstance(two_refs, BootstrapResult) and "signature" in two_refs.to_dict()


def test_bleu_bootstrap_clearly_better(mt_systems):
    _, _, refs = mt_systems
    good = [" ".join(r.split()[:-1]) if i % 4 == 0 else r for i, r in enumerate(refs)]  # 3/4 exact copies
    bad = [" ".join(reversed(r.split())) for r in refs]
    res = paired_bootstrap_bleu(bad, good, refs, n_resamples=200)
    assert res.delta > 50 and res.p_value < 0.01


def test_bleu_bootstrap_rejects_mismatched_lengths(mt_systems):
    hyps_a, hyps_b, refs = mt_systems
    with pytest.raises(DataError, match="hyps_a has 150 sentences but hyps_b has 149"):
        paired_bootstrap_bleu(hyps_a, hyps_b[:-1], refs)
    with pytest.raises(DataError, match=r"hyps has 150 sentences but the references have \[149\]"):
        paired_bootstrap_bleu(hyps_a, hyps_b, refs[:-1])
