"""Type-I error of every reported significance test, simulated under a true null (issue 25).

    python benchmarks/significance_level.py [--quick]   # writes benchmarks/results/significance_level.json

Each null draws two exchangeable systems (the same distribution per example, so no real difference) and
counts how often a test rejects at alpha 0.05 and 0.01; a valid two-sided test rejects about alpha of
the time. Reported tests (:func:`headprune.evaluation.significance.compare`):

- accuracy: McNemar mid-p on 872 paired 0/1 outcomes (SST-2's dev size), 10% and 4% discordant;
- perplexity / NLL: sign-flip permutation of per-block NLL sums (skewed, heteroscedastic blocks);
- corpus BLEU: paired approximate randomization of sacreBLEU sentence statistics (real tokenisation of
  synthetic sentences; corpus BLEU of every system checked against ``sacrebleu.corpus_bleu``);
- corpus F1: approximate randomization of confusion counts.

Beside them, for contrast: the exact McNemar p, the paired t-test, the two-sided centred bootstrap and
sacreBLEU's paired-bootstrap statistic (one-tailed in effect). Each rate comes with its 95% binomial
(Clopper-Pearson) interval; ``acceptance`` checks every reported test at 0.05 is in [0.035, 0.065]. Also
checked: p < alpha exactly when the reported 95% interval excludes 0, over every simulated comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from headprune.evaluation.base import EvalResult  # noqa: E402
from headprune.evaluation.metrics import bleu_statistics  # noqa: E402
from headprune.evaluation.significance import (  # noqa: E402
    STATISTICS,
    bleu_batch,
    compare,
    mcnemar_midp_p,
    sign_flip_test,
)
from headprune.provenance import code_identity, versions  # noqa: E402

ALPHAS = (0.05, 0.01)
ACCEPT = (0.035, 0.065)


def rates(p: np.ndarray) -> dict:
    out = {"n": int(len(p))}
    for alpha in ALPHAS:
        k = int(np.sum(np.asarray(p) < alpha))
        ci = stats.binomtest(k, len(p)).proportion_ci(0.95, method="exact")
        out[str(alpha)] = {"rate": k / len(p), "ci95": [float(ci.low), float(ci.high)]}
    return out


def _result(metric: str, per_example: dict) -> EvalResult:
    n = len(next(iter(per_example.values())))
    return EvalResult(metric=metric, score=0.0, n=n, per_example=per_example, higher_is_better=True)


def mcnemar(n_sims: int, n: int, discordant: float, seed: int) -> dict:
    """Vectorised: the discordant cells of n examples, each discordant pair either way with equal chance."""
    rng = np.random.default_rng(seed)
    cells = rng.multinomial(n, [1 - discordant, discordant / 2, discordant / 2], size=n_sims)
    only_a, only_b = cells[:, 1], cells[:, 2]
    d = only_a + only_b
    exact = np.where(d == 0, 1.0, np.minimum(1.0, 2 * np.minimum(stats.binom.cdf(only_b, d, 0.5),
                                                                   stats.binom.sf(only_b - 1, d, 0.5))))
    return {"examples": n, "discordant_share": discordant, "mcnemar_midp (reported)": rates(mcnemar_midp_p(only_a, only_b)),
            "mcnemar_exact (beside)": rates(exact)}


def paired_ttest_on_outcomes(n_sims: int, n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    p = []
    for _ in range(n_sims):
        shared = rng.random(n) < 0.85
        flip_a, flip_b = rng.random(n) < 0.05, rng.random(n) < 0.05
        a, b = (shared ^ flip_a).astype(float), (shared ^ flip_b).astype(float)
        p.append(1.0 if np.all(a == b) else stats.ttest_rel(b, a).pvalue)
    return {"examples": n, "paired_ttest (beside)": rates(np.asarray(p))}


def sign_flip(n_sims: int, n: int, resamples: int, seed: int) -> dict:
    """Per-block NLL sums: a shared skewed difficulty, each system its own skewed noise (symmetric difference)."""
    rng = np.random.default_rng(seed)
    p, agree = [], 0
    for i in range(n_sims):
        difficulty = rng.gamma(2.0, 40.0, n)
        a = difficulty + rng.gamma(1.0, 5.0, n) * rng.choice([0.5, 2.0], n)
        b = difficulty + rng.gamma(1.0, 5.0, n) * rng.choice([0.5, 2.0], n)
        tokens = np.full(n, 128.0)
        out = compare(_result("nll", {"nll_sum": a, "tokens": tokens}), _result("nll", {"nll_sum": b, "tokens": tokens}),
                      n_resamples=resamples, seed=i)
        p.append(out["p_value"])
        agree += (out["p_value"] < 0.05) == (out["ci_low"] > 0 or out["ci_high"] < 0)
    res = sign_flip_test(np.zeros(3), np.ones(3), n_resamples=10, seed=0)  # the function compare() reports
    return {"blocks": n, "resamples": resamples, "sign_flip (reported)": rates(np.asarray(p)),
            "interval_agrees_with_p": agree, "of": n_sims, "checked_function": type(res).__name__}


def bleu_pool(n_sentences: int, variants: int, seed: int) -> tuple[list[str], list[list[str]], np.ndarray]:
    """References and `variants` noisy hypotheses per sentence, all drawn alike (so any two are exchangeable);
    their sacreBLEU sentence statistics [variants, n, 10]."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(300)] + [",", ".", "the", "a", "of"]
    refs = [" ".join(rng.choice(vocab, size=int(rng.integers(6, 28)))) for _ in range(n_sentences)]
    noise = rng.uniform(0.15, 0.6, n_sentences)  # per-sentence difficulty, shared by every variant

    def hyp(ref: str, p: float) -> str:
        words = [w if rng.random() > p else str(rng.choice(vocab)) for w in ref.split()]
        if rng.random() < 0.3:
            words = words[: max(1, len(words) - int(rng.integers(1, 4)))]  # some short: the brevity penalty moves
        return " ".join(words)

    hyps = [[hyp(r, q) for r, q in zip(refs, noise, strict=True)] for _ in range(variants)]
    pool = np.stack([bleu_statistics(h, refs)[0] for h in hyps])
    return refs, hyps, pool


def corpus_bleu(n_sims: int, n_sentences: int, variants: int, resamples: int, seed: int) -> dict:
    import sacrebleu

    refs, hyps, pool = bleu_pool(n_sentences, variants, seed)
    sacre = [sacrebleu.corpus_bleu(h, [refs]).score for h in hyps]
    ours = bleu_batch(pool.sum(axis=1))
    assert np.allclose(ours, sacre, rtol=0, atol=1e-9), "vectorised corpus BLEU differs from sacrebleu.corpus_bleu"
    rng = np.random.default_rng(seed + 1)
    p, boot, sacre_p, agree = [], [], [], 0
    rows = np.arange(n_sentences)
    for i in range(n_sims):
        pick = rng.integers(0, variants, (2, n_sentences))
        a, b = pool[pick[0], rows], pool[pick[1], rows]
        out = compare(_result("bleu", {"bleu_stats": a}), _result("bleu", {"bleu_stats": b}), n_resamples=resamples, seed=i)
        p.append(out["p_value"])
        boot.append(out["p_bootstrap"])
        sacre_p.append(out["p_sacrebleu"])
        agree += (out["p_value"] < 0.05) == (out["ci_low"] > 0 or out["ci_high"] < 0)
    return {"sentences": n_sentences, "variants_per_sentence": variants, "resamples": resamples,
            "corpus_bleu_checked_against_sacrebleu": len(hyps),
            "approximate_randomization (reported)": rates(np.asarray(p)),
            "bootstrap_two_sided (beside)": rates(np.asarray(boot)),
            "sacrebleu_paired_bs (beside, one-tailed)": rates(np.asarray(sacre_p)),
            "interval_agrees_with_p": agree, "of": n_sims}


def corpus_f1(n_sims: int, n: int, resamples: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    p, agree = [], 0
    for i in range(n_sims):
        labels = (rng.random(n) < 0.6).astype(int)
        easy = rng.random(n) < 0.7  # both right on easy examples; each its own coin on the rest
        pa = np.where(easy | (rng.random(n) < 0.5), labels, 1 - labels)
        pb = np.where(easy | (rng.random(n) < 0.5), labels, 1 - labels)
        out = compare(_result("f1", {"pred": pa, "label": labels}), _result("f1", {"pred": pb, "label": labels}),
                      n_resamples=resamples, seed=i)
        p.append(out["p_value"])
        agree += (out["p_value"] < 0.05) == (out["ci_low"] > 0 or out["ci_high"] < 0)
    return {"examples": n, "resamples": resamples, "approximate_randomization (reported)": rates(np.asarray(p)),
            "interval_agrees_with_p": agree, "of": n_sims}


def acceptance(results: dict) -> dict:
    checks = {}
    for name, block in results.items():
        for test, value in block.items():
            if isinstance(value, dict) and "(reported)" in test:
                rate = value["0.05"]["rate"]
                checks[f"{name}: {test}"] = {"rate_at_0.05": rate, "within": ACCEPT[0] <= rate <= ACCEPT[1]}
    return {"range_at_0.05": list(ACCEPT), "tests": checks, "all_within": all(c["within"] for c in checks.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds), written to --out only if given")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    scale = 0.05 if args.quick else 1.0
    size = lambda n: max(40, int(n * scale))  # noqa: E731
    started = time.perf_counter()
    results = {
        "accuracy_10pct_discordant": mcnemar(size(200_000), 872, 0.10, seed=1),
        "accuracy_4pct_discordant": mcnemar(size(200_000), 872, 0.04, seed=2),
        "accuracy_ttest": paired_ttest_on_outcomes(size(2000), 872, seed=3),
        "nll_per_block": sign_flip(size(2000), 60, 999, seed=4),
        "corpus_bleu": corpus_bleu(size(1200), 150, 24, 499, seed=5),
        "corpus_f1": corpus_f1(size(1000), 400, 499, seed=6),
    }
    out = {"what": "simulated type-I error under a true null, per reported test (issue 25)",
           "statistics": STATISTICS, "quick": args.quick, "alphas": list(ALPHAS), "results": results,
           "acceptance": acceptance(results), "seconds": round(time.perf_counter() - started, 1),
           "code": code_identity(), "versions": versions()}
    path = args.out or (None if args.quick else ROOT / "benchmarks" / "results" / "significance_level.json")
    text = json.dumps(out, indent=1)
    if path is not None:
        path.write_text(text + "\n")
    print(json.dumps(out["acceptance"], indent=1))
    print(f"{out['seconds']} s" + (f"; wrote {path}" if path else ""))


if __name__ == "__main__":
    main()
