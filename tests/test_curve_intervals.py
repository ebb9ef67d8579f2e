"""Pruning curves carry the 95% paired-bootstrap interval of each step's change from the unpruned model."""

from __future__ import annotations

import csv
import random

import numpy as np
import pytest
import torch

import headprune as hp
from headprune.evaluation import LanguageModelling
from headprune.experiments.curves import CurveSettings
from headprune.experiments.rundir import RunOutput
from headprune.experiments.study import run_curves
from tiny import build, word_tokenizer


def test_curve_steps_have_the_interval_of_their_test(tmp_path):
    rng = random.Random(0)
    texts = [" ".join(rng.choice("a b c d e f g h i j".split()) for _ in range(40)) for _ in range(20)]
    model = build("gpt2")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    ev = LanguageModelling(word_tokenizer(texts), texts, block_size=16, batch_size=16)
    settings = CurveSettings(fractions=(0.0, 0.5, 1.0), orders=("importance", "random"), seeds=(0, 1))
    run_curves(model, ev, RunOutput(tmp_path / "curve", progress=False), settings=settings)
    with open(tmp_path / "curve" / "curves.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(tmp_path / "curve" / "curves_summary.csv", newline="") as f:
        summary = list(csv.DictReader(f))
    assert {"ci_low", "ci_high", "p_value"} <= set(rows[0]) and {"ci_low", "ci_high"} <= set(summary[0])
    assert all(s["ci_low"] == "" for s in summary if s["order"] == "random" and s["pruned"] != "0")  # 2 seeds: none
    base = ev.evaluate(model)
    half = next(r for r in rows if r["order"] == "importance" and float(r["fraction"]) == 0.5)
    scores = hp.head_importance(model, ev.batches())
    masked = ev.evaluate(model, hp.mask_from_heads(model, hp.lowest_heads(scores, fraction=0.5)))
    assert float(half["score"]) == pytest.approx(masked.score, rel=1e-12)
    # the perplexity's test, by hand: sign-flip permutation of per-block NLL differences (1000 sign patterns,
    # seed 0), T = sum_i (nll_b - nll_a)_i / tokens; the 95% half-width is the largest |T| the +1-floored p
    # does not reject; the NLL interval maps to perplexity through exp (monotone: the same test)
    tokens = base.per_example["tokens"].sum()
    d = (masked.per_example["nll_sum"] - base.per_example["nll_sum"]) / tokens
    signs = np.where(np.random.default_rng(0).random((1000, len(d))) < 0.5, -1.0, 1.0)
    null = np.sort(np.abs((signs * d).sum(1)))[::-1]
    k = next(k for k in range(1001) if (k + 1) / 1001 >= 0.05) - 1  # most resamples >= |T| with p < 0.05
    t, ppl_a = d.sum(), np.exp(base.per_example["nll_sum"].sum() / tokens)
    low, high = ppl_a * np.expm1(t - null[k]), ppl_a * np.expm1(t + null[k])
    assert (float(half["ci_low"]), float(half["ci_high"])) == pytest.approx((low, high), rel=1e-6)
    p = (1 + np.sum(null >= abs(t))) / 1001
    assert float(half["p_value"]) == pytest.approx(p, rel=1e-9)
    assert (p < 0.05) == (low > 0 or high < 0)  # the interval and the p are one test
    assert high - low > 0 and 0 <= float(half["p_value"]) <= 1
    zero = next(r for r in rows if float(r["fraction"]) == 0)
    assert float(zero["ci_low"]) == float(zero["ci_high"]) == 0.0 and float(zero["p_value"]) == 1.0
