"""Two-sided tests and multiplicity control against independent references (scipy, hand computation)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from headprune.errors import ConfigError, DataError
from headprune.evaluation.base import EvalResult
from headprune.evaluation.multiplicity import adjust, adjust_rows, benjamini_hochberg, holm
from headprune.evaluation.significance import compare, mcnemar_exact, paired_ttest


def test_holm_by_hand():
    # m = 4, sorted: 0.01*4 = 0.04, 0.02*3 = 0.06, 0.03*2 = 0.06, 0.5*1 = 0.5 (running max keeps them monotone)
    p = [0.03, 0.5, 0.01, 0.02]
    assert holm(p) == pytest.approx([0.06, 0.5, 0.04, 0.06], abs=1e-15)
    # a later smaller product is raised to the running maximum; products above 1 are cut to 1
    assert holm([0.3, 0.2, 0.9]) == pytest.approx([0.6, 0.6, 0.9], abs=1e-15)
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0], abs=1e-15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_benjamini_hochberg_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.random(40), rng.random(10) * 1e-3])  # some signal among noise, with ties unlikely
    p[3] = p[7]  # and one tie
    assert benjamini_hochberg(p) == pytest.approx(stats.false_discovery_control(p, method="bh"), abs=1e-14)
    assert adjust(p, "bh") == pytest.approx(benjamini_hochberg(p), abs=0)


def test_holm_is_never_below_raw_nor_bh():
    p = np.random.default_rng(4).random(30) ** 3
    assert (holm(p) >= p - 1e-15).all() and (holm(p) >= benjamini_hochberg(p) - 1e-15).all()


def test_adjust_rows_defines_significance_by_the_adjusted_p():
    rows = [{"p_value": p} for p in (0.004, 0.009, 0.2)]
    adjust_rows(rows, "holm", alpha=0.01)
    assert [r["p_adjusted"] for r in rows] == pytest.approx([0.012, 0.018, 0.2])
    assert [r["significant"] for r in rows] == [False, False, False]  # raw 0.004 < 0.01, but not adjusted
    adjust_rows(rows, "holm", alpha=0.05)
    assert [r["significant"] for r in rows] == [True, True, False]


def test_bad_corrections_and_p_values_are_refused():
    with pytest.raises(ConfigError, match="correction='bonferroni'; allowed: holm, bh"):
        adjust([0.1], "bonferroni")
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        holm([0.1, 1.5])


def _outcomes(seed: int, n: int, p: float) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) < p).astype(int)


def test_mcnemar_exact_matches_the_binomial_test_on_discordant_pairs():
    a, b = _outcomes(1, 300, 0.7), _outcomes(2, 300, 0.75)
    only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    res = mcnemar_exact(a, b)
    assert (res.only_a, res.only_b, res.n) == (only_a, only_b, 300)
    assert res.p_value == pytest.approx(stats.binomtest(only_b, only_a + only_b, 0.5).pvalue, abs=1e-15)
    assert mcnemar_exact(b, a).p_value == res.p_value  # two-sided
    # by hand: 1 discordant pair of 1 -> p = 2 * 0.5 = 1; 6 of 6 one way -> 2 * 0.5^6
    assert mcnemar_exact([1, 0, 0], [1, 1, 0]).p_value == pytest.approx(1.0)
    assert mcnemar_exact([0] * 6 + [1], [1] * 6 + [1]).p_value == pytest.approx(2 * 0.5**6)
    assert mcnemar_exact([1, 0], [1, 0]).p_value == 1.0


def _result(metric: str, per_example: dict, score: float) -> EvalResult:
    n = len(next(iter(per_example.values())))
    return EvalResult(metric=metric, score=score, n=n, per_example=per_example, higher_is_better=True)


def test_compare_reports_mcnemar_midp_for_accuracy_and_randomization_for_corpus_metrics():
    a, b = _outcomes(3, 200, 0.6), _outcomes(4, 200, 0.7)
    out = compare(_result("accuracy", {"correct": a}, a.mean()), _result("accuracy", {"correct": b}, b.mean()),
                  n_resamples=200)
    only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    d = only_a + only_b  # mid-p by hand from scipy's binomial: twice the smaller tail, half the point mass
    lower = stats.binom.cdf(only_b - 1, d, 0.5) + stats.binom.pmf(only_b, d, 0.5) / 2
    assert out["p_value"] == pytest.approx(min(1.0, 2 * min(lower, 1 - lower)), abs=1e-12)
    assert out["test"].startswith("McNemar mid-p") and out["p_value"] < out["p_mcnemar"]  # mid-p < exact
    assert out["p_ttest"] == pytest.approx(stats.ttest_rel(b, a).pvalue) and out["p_ttest"] == paired_ttest(a, b).p_value
    assert out["p_mcnemar"] == mcnemar_exact(a, b).p_value and "p_bootstrap" not in out
    assert out["ci_low"] < b.mean() - a.mean() < out["ci_high"]
    assert (out["p_value"] < 0.05) == (out["ci_low"] > 0 or out["ci_high"] < 0)
    labels = _outcomes(5, 200, 0.5)
    pa, pb = np.where(a == 1, labels, 1 - labels), np.where(b == 1, labels, 1 - labels)
    f1 = compare(_result("f1", {"pred": pa, "label": labels}, 0.0), _result("f1", {"pred": pb, "label": labels}, 0.0),
                 n_resamples=200)
    assert f1["test"].startswith("paired approximate randomization") and "p_ttest" not in f1 and 0 < f1["p_bootstrap"] <= 1 and f1["ci_low"] <= f1["ci_high"]
    assert f1["n_resamples"] == 200 and (f1["p_value"] < 0.05) == (f1["ci_low"] > 0 or f1["ci_high"] < 0)


def test_cli_refuses_an_unknown_correction_naming_the_flag(tmp_path):
    from typer.testing import CliRunner

    from headprune.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["ablate", str(tmp_path), "--task", "classification", "--data", str(tmp_path),
                                      "--correction", "bonferroni", "-o", str(out)])
    assert result.exit_code == 2 and "--correction 'bonferroni': allowed: holm, bh" in result.output
    assert not out.exists()


def test_a_sweep_adjusts_over_all_its_heads_with_the_chosen_correction():
    import random

    import torch

    from headprune.evaluation import LanguageModelling
    from headprune.experiments.ablation import SweepSettings, one_head_ablation
    from tiny import build, word_tokenizer

    rng = random.Random(0)
    texts = [" ".join(rng.choice("a b c d e f g h i j".split()) for _ in range(40)) for _ in range(20)]
    model = build("gpt2")
    with torch.no_grad():  # larger weights: masking a head changes the perplexity
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    ev = LanguageModelling(word_tokenizer(texts), texts, block_size=16, batch_size=16)
    sweeps = {c: one_head_ablation(model, ev, settings=SweepSettings(alpha=0.2, n_resamples=200, correction=c),
                                   progress=False) for c in ("holm", "bh")}
    raw = [r["p_value"] for r in sweeps["holm"].rows]
    assert raw == [r["p_value"] for r in sweeps["bh"].rows] and min(raw) < 0.05 < max(raw)  # some heads matter
    assert [r["p_adjusted"] for r in sweeps["bh"].rows] == pytest.approx(stats.false_discovery_control(raw), abs=1e-12)
    assert [r["p_adjusted"] for r in sweeps["holm"].rows] == pytest.approx(holm(raw), abs=0)
    for sweep in sweeps.values():
        for r in sweep.rows:
            assert r["significant"] == (r["p_adjusted"] < 0.2) and r["p_value"] <= r["p_adjusted"]
            assert r["test"].startswith("sign-flip") and "p_ttest" not in r and r["ci_low"] <= r["ci_high"]
