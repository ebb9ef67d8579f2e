"""Is a difference significant? Tests that keep their level, each with the interval of the same test.

Convention: system `a` is the baseline (e.g. the full model), `b` the variant (e.g. one head ablated);
every `delta` is `score_b - score_a`. Needs scipy (the ``study`` extra). Every reported p is two-sided.

:func:`compare` picks the reported test by what the metric is:

- accuracy (0/1 outcome per example): McNemar's mid-p test on the discordant pairs (Fagerland, Lydersen
  & Laake 2013), with the mid-p Clopper-Pearson interval of the discordant share mapped to delta. The
  exact McNemar p (conservative: size 0.027-0.040 at alpha 0.05 for 60-400 discordant pairs) and the
  paper's paired t-test stay beside it as ``p_mcnemar`` / ``p_ttest``.
- perplexity / NLL (a sum of per-block NLLs over the same tokens): sign-flip permutation test of the
  per-block NLL differences, with the interval delta +- the test's critical value.
- BLEU, F1, Matthews (corpus metrics): paired approximate randomization (each example's two outputs
  swapped at random; sacreBLEU's ``--paired-ar``), with the interval delta +- the test's critical value.
  Beside it ``p_bootstrap``: the paired bootstrap made two-sided, centred p
  ``(1 + #{|delta_i - mean delta| >= |delta|}) / (1 + B)``: its level depends on the data (simulated at
  alpha 0.05: 0.029-0.038 on synthetic BLEU statistics, 0.057 on sacreBLEU-tokenised sentences), while
  the randomization test is exact under exchangeable systems, so the bootstrap is not the reported test;
  and for BLEU ``p_sacrebleu``, sacreBLEU's paired-bootstrap statistic (one-tailed in effect: 0.12).

In every reported test ``p < alpha`` exactly when the ``1 - alpha`` interval excludes 0 (a test checks it).

Each test's level is simulated under a true null in ``tests/test_significance_level.py`` and
``benchmarks/significance_level.py``. A sweep of m tests needs enough resamples for its smallest
adjusted p to fall below alpha: :func:`min_resamples` / :func:`resamples_for`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, DataError
from ..extras import require
from .base import EvalResult
from .exact_tests import (  # noqa: F401  (re-exported)
    CI_ALPHA,
    McNemarMidPResult,
    McNemarResult,
    PearsonResult,
    TTestResult,
    binary_outcomes,
    mcnemar_exact,
    mcnemar_midp,
    mcnemar_midp_p,
    paired_arrays,
    paired_ttest,
    pearson,
)
from .goals import goal_met  # noqa: F401  (re-exported)
from .metrics import CLASSIFICATION_METRICS, bleu_scorer, bleu_statistics, labels_array
from .resampling import (  # noqa: F401  (re-exported: the tests' and benchmarks' names)
    bleu_batch,
    bootstrap_indices,
    centred_p_value,
    check_alpha,
    check_resamples,
    confusion_batch,
    critical_value,
    min_resamples,
    resamples_for,
    resampling_p_value,
    sacrebleu_p_value,
    sign_flip_signs,
    swap_masks,
)

scipy_stats = require("scipy.stats", "significance tests")

STATISTICS = "issue-25: McNemar mid-p | sign-flip | approximate randomization; two-sided, +1 floor"  # in run
# signatures: a run whose signature lacks this string was tested by older statistics (stale)
SACREBLEU_SEED = 12345  # sacrebleu's default SACREBLEU_SEED: same seed -> same resamples as `sacrebleu --paired-bs`


@dataclass(frozen=True)
class BootstrapResult:
    """Paired bootstrap of a corpus metric over n examples.

    p_value: two-sided centred bootstrap p, (1 + #{|delta_i - mean delta| >= |delta|}) / (1 + n_resamples),
    of the resampled deltas delta_i = score_b_i - score_a_i (:func:`centred_p_value`).
    ci_low/ci_high: delta -+ the test's critical value at ``ci_alpha`` (:func:`critical_value`): the
    interval excludes 0 exactly when p_value < ci_alpha.
    p_sacrebleu: sacreBLEU's paired-bootstrap statistic for the same resamples (one-tailed in effect;
    beside the reported p, never instead of it).
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
    p_sacrebleu: float
    ci_alpha: float = CI_ALPHA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BleuBootstrapResult(BootstrapResult):
    """BootstrapResult for BLEU, plus sacreBLEU's signature (``p_sacrebleu`` equals sacreBLEU's ``PairedTest``)."""

    signature: str = ""  # e.g. nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0


@dataclass(frozen=True)
class PermutationResult:
    """Paired permutation test: each example's two outcomes swapped (or its difference's sign flipped)
    at random, the null of exchangeable systems.

    p_value: (1 + #{|T_j| >= |T|}) / (1 + n_resamples), T_j the statistic of the j-th random swap.
    ci_low/ci_high: delta -+ the test's critical value at ``ci_alpha`` (excludes 0 iff p < ci_alpha).
    """

    delta: float  # the observed statistic
    p_value: float
    ci_low: float
    ci_high: float
    n: int
    n_resamples: int
    seed: int | None
    ci_alpha: float = CI_ALPHA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- paired bootstrap


def resample_scores(
    stats: np.ndarray, metric: Callable[[np.ndarray], float], indices: np.ndarray,
    reduce: Literal["sum", "rows"] = "sum", batch_metric: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """metric of each resample -> [n_resamples]. reduce='sum': metric(stats[idx].sum(0)); 'rows': metric(stats[idx]).

    ``batch_metric`` (reduce='sum' only): the same metric on a stack of sums [chunk, ...] -> [chunk].
    """
    if reduce == "rows":
        return np.array([metric(stats[idx]) for idx in indices], dtype=np.float64)
    flat = stats.reshape(len(stats), -1)  # [n, k]
    chunk = max(1, 2**21 // max(1, flat.size))  # resamples per gather, ~16 MB of float64
    out = []
    for start in range(0, len(indices), chunk):
        sums = flat[indices[start:start + chunk]].sum(axis=1)  # [chunk, k]
        if batch_metric is not None:
            out.extend(batch_metric(sums.reshape(len(sums), *stats.shape[1:])))
        else:
            out.extend(metric(s.reshape(stats.shape[1:])) for s in sums)
    return np.asarray(out, dtype=np.float64)


def paired_bootstrap(
    stats_a: Any, stats_b: Any, metric: Callable[[np.ndarray], float], *, n_resamples: int = 1000,
    seed: int | None = 0, reduce: Literal["sum", "rows"] = "sum", ci_alpha: float = CI_ALPHA,
) -> BootstrapResult:
    """Paired bootstrap of a corpus metric from per-example statistics arrays [n, ...].

    Each resample draws n example indices with replacement, shared by a and b. With reduce='sum' the
    metric sees the statistics summed over the drawn examples (shape [...], e.g. BLEU counts, number
    correct); with reduce='rows' it sees the drawn rows [n, ...] (e.g. (pred, label) pairs).
    """
    check_resamples(n_resamples, seed)
    check_alpha(ci_alpha, "ci_alpha")
    if reduce not in ("sum", "rows"):
        raise ConfigError(f"reduce={reduce!r} must be 'sum' or 'rows'")
    stats_a, stats_b = paired_arrays(stats_a, stats_b, ("stats_a", "stats_b"))
    return _bootstrap(stats_a, stats_b, metric, n_resamples, seed, reduce, ci_alpha)[0]


def _bootstrap(stats_a: np.ndarray, stats_b: np.ndarray, metric: Callable[[np.ndarray], float],
               n_resamples: int, seed: int | None, reduce: str, ci_alpha: float = CI_ALPHA,
               batch_metric: Callable[[np.ndarray], np.ndarray] | None = None,
               ) -> tuple[BootstrapResult, np.ndarray, np.ndarray]:
    whole = (lambda s: metric(s.sum(axis=0))) if reduce == "sum" else metric
    score_a, score_b = float(whole(stats_a)), float(whole(stats_b))
    indices = bootstrap_indices(len(stats_a), n_resamples, seed)
    scores_a = resample_scores(stats_a, metric, indices, reduce, batch_metric)  # type: ignore[arg-type]
    scores_b = resample_scores(stats_b, metric, indices, reduce, batch_metric)  # type: ignore[arg-type]
    diffs = scores_b - scores_a
    delta = score_b - score_a
    null = np.abs(diffs - diffs.mean())
    half = critical_value(null, ci_alpha)
    result = BootstrapResult(
        score_a, score_b, delta, resampling_p_value(null, delta), delta - half, delta + half,
        float(scores_a.mean()), float(scores_b.mean()), len(stats_a), n_resamples,
        None if seed is None else int(seed), sacrebleu_p_value(diffs, delta), ci_alpha,
    )
    return result, scores_a, scores_b


def paired_bootstrap_accuracy(
    correct_a: Any, correct_b: Any, *, n_resamples: int = 1000, seed: int | None = 0
) -> BootstrapResult:
    """Paired bootstrap of accuracy (a fraction in [0, 1]) from 0/1 outcomes per example [n].

    Not the reported test for accuracy (that is :func:`mcnemar_midp`); kept as a corpus-metric check.
    """
    a, b = binary_outcomes(correct_a, correct_b)
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
    `PairedTest(test_type='bs')`, so scores, resample means and ``p_sacrebleu`` match it; the reported
    ``p_value`` is the two-sided centred p of the same resamples.
    """
    check_resamples(n_resamples, seed)
    if len(hyps_a) != len(hyps_b):
        raise DataError(f"hyps_a has {len(hyps_a)} sentences but hyps_b has {len(hyps_b)}")
    stats_a, bleu = bleu_statistics(hyps_a, refs, tokenize=tokenize, lowercase=lowercase, force=force)
    stats_b, _ = bleu_statistics(hyps_b, refs, tokenize=tokenize, lowercase=lowercase, force=force)
    result, _, _ = _bootstrap(stats_a, stats_b, bleu_scorer(bleu), n_resamples, seed, "sum")
    signature = bleu.get_signature()
    signature.update("bs", n_resamples)
    signature.update("seed", str(seed).lower())
    return BleuBootstrapResult(**asdict(result), signature=signature.format())


# ---------------------------------------------------------------- permutation and exact tests


def paired_permutation(
    stats_a: Any, stats_b: Any, metric: Callable[[np.ndarray], float], *, n_resamples: int = 1000,
    seed: int | None = 0, batch_metric: Callable[[np.ndarray], np.ndarray] | None = None,
    ci_alpha: float = CI_ALPHA,
) -> PermutationResult:
    """Paired approximate randomization of a corpus metric (Noreen 1989; Riezler & Maxwell 2005).

    stats_a, stats_b [n, ...]: per-example statistics whose sum the metric scores (BLEU counts, one-hot
    confusion cells). Under the null the two systems' outputs are exchangeable example by example, so
    each resample swaps a random half of the pairs and scores both corpora again; T = metric(b) -
    metric(a). ``batch_metric`` scores a stack of sums [chunk, ...] -> [chunk] at once.
    """
    check_resamples(n_resamples, seed)
    check_alpha(ci_alpha, "ci_alpha")
    stats_a, stats_b = paired_arrays(stats_a, stats_b, ("stats_a", "stats_b"))
    shape = stats_a.shape[1:]
    flat_a, flat_b = stats_a.reshape(len(stats_a), -1), stats_b.reshape(len(stats_b), -1)  # [n, k]
    sum_a, sum_b = flat_a.sum(axis=0), flat_b.sum(axis=0)  # [k]
    score = batch_metric or (lambda sums: np.array([metric(s) for s in sums], dtype=np.float64))
    observed = score(np.stack([sum_a, sum_b]).reshape(2, *shape))
    masks = swap_masks(len(flat_a), n_resamples, seed)  # [B, n]
    chunk = max(1, 2**21 // max(1, flat_a.shape[1] * 8))
    null = []
    for start in range(0, n_resamples, chunk):
        swapped_a = sum_a + masks[start:start + chunk] @ (flat_b - flat_a)  # [chunk, k]
        swapped_b = sum_a + sum_b - swapped_a
        null.append(np.abs(score(swapped_b.reshape(-1, *shape)) - score(swapped_a.reshape(-1, *shape))))
    null = np.concatenate(null)
    delta = float(observed[1] - observed[0])
    half = critical_value(null, ci_alpha)
    return PermutationResult(delta, resampling_p_value(null, delta), delta - half, delta + half, len(flat_a),
                             n_resamples, None if seed is None else int(seed), ci_alpha)


def sign_flip_test(a: Any, b: Any, *, weights: Any = None, n_resamples: int = 1000, seed: int | None = 0,
                   ci_alpha: float = CI_ALPHA) -> PermutationResult:
    """Paired sign-flip permutation test of real per-example scores [n]: T = sum_i w_i (b_i - a_i).

    Under the null (b_i - a_i symmetric about 0) each difference's sign is a coin flip; the p counts the
    random sign patterns whose |T| reaches the observed one (+1 floor). weights [n] default 1 / n (T is
    the mean difference); for a corpus NLL pass the NLL sums with weights 1 / total tokens.
    """
    check_resamples(n_resamples, seed)
    check_alpha(ci_alpha, "ci_alpha")
    a, b = paired_arrays(a, b, ("a", "b"))
    if a.ndim != 1:
        raise DataError(f"a and b must be 1-D per-example scores; got shape {a.shape}")
    w = np.full(len(a), 1.0 / len(a)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != a.shape:
        raise DataError(f"weights must have shape {a.shape}; got {w.shape}")
    d = w * (b - a)  # [n]
    signs = np.vstack([np.ones((1, len(d))), sign_flip_signs(len(d), n_resamples, seed)])  # row 0: observed
    stats = (signs * d).sum(axis=1)  # [1 + B], one summation order for every row
    delta, null = float(stats[0]), np.abs(stats[1:])
    half = critical_value(null, ci_alpha)
    return PermutationResult(delta, resampling_p_value(null, delta), delta - half, delta + half, len(d),
                          n_resamples, None if seed is None else int(seed), ci_alpha)


# ---------------------------------------------------------------- two evaluations


def compare(base: EvalResult, other: EvalResult, *, n_resamples: int = 1000, seed: int = 0) -> dict:
    """The reported test of ``other`` against ``base`` (same examples), two-sided, and its 95% interval.

    Returns {"test": name, "p_value": its p, "ci_low", "ci_high": the 95% interval of the same test on
    the metric's scale (p_value < 0.05 iff it excludes 0), "n_resamples"}, and beside them: accuracy
    "p_mcnemar" (exact, conservative) and "p_ttest" (the paper's); corpus metrics "p_bootstrap"
    (two-sided centred bootstrap) and for BLEU "p_sacrebleu" (sacreBLEU's one-tailed statistic).
    """
    if base.n != other.n or base.metric != other.metric:
        raise ConfigError(f"cannot compare {base.metric} on {base.n} examples with {other.metric} on {other.n}")
    a, b = base.per_example, other.per_example
    if base.metric == "accuracy" and "correct" in a:
        mid = mcnemar_midp(a["correct"], b["correct"])
        return {"test": "McNemar mid-p (paired correctness)", "p_value": mid.p_value,
                "p_mcnemar": mcnemar_exact(a["correct"], b["correct"]).p_value,
                "p_ttest": paired_ttest(a["correct"], b["correct"]).p_value,
                "ci_low": mid.ci_low, "ci_high": mid.ci_high}
    if base.metric in ("f1", "matthews") and "pred" in a:
        labels, pa, pb = (labels_array(x, name) for x, name in [(a["label"], "labels"), (a["pred"], "preds_a"),
                                                                 (b["pred"], "preds_b")])
        k = int(max(pa.max(), pb.max(), labels.max()) + 1)
        eye = np.eye(k * k, dtype=np.float64)  # one-hot of the (label, pred) cell; summing gives the confusion
        batch = confusion_batch(base.metric, k)
        sa, sb = eye[labels * k + pa], eye[labels * k + pb]
        perm = paired_permutation(sa, sb, lambda c: float(batch(c[None])[0]), n_resamples=n_resamples, seed=seed,
                                  batch_metric=batch)
        boot, _, _ = _bootstrap(sa, sb, lambda c: float(batch(c[None])[0]), n_resamples, seed, "sum", batch_metric=batch)
        return _perm(f"paired approximate randomization of corpus {base.metric}", perm, boot)
    if base.metric == "bleu" and "bleu_stats" in a:
        sa, sb = paired_arrays(a["bleu_stats"], b["bleu_stats"], ("a bleu_stats", "b bleu_stats"))
        perm = paired_permutation(sa, sb, lambda s: float(bleu_batch(s[None])[0]), n_resamples=n_resamples,
                                  seed=seed, batch_metric=bleu_batch)
        boot, _, _ = _bootstrap(sa, sb, lambda s: float(bleu_batch(s[None])[0]), n_resamples, seed, "sum",
                                batch_metric=bleu_batch)
        return {**_perm("paired approximate randomization of corpus BLEU", perm, boot),
                "p_sacrebleu": boot.p_sacrebleu}
    if base.metric in ("perplexity", "nll") and "nll_sum" in a:
        tokens = float(np.sum(a["tokens"]))
        flip = sign_flip_test(a["nll_sum"], b["nll_sum"], weights=np.full(len(a["nll_sum"]), 1.0 / tokens),
                              n_resamples=n_resamples, seed=seed)
        low, high = flip.ci_low, flip.ci_high  # on the NLL-per-token scale
        if base.metric == "perplexity":  # perplexity is monotone in NLL: map the interval, same test
            nll_a = float(np.sum(a["nll_sum"])) / tokens
            low, high = (math.exp(nll_a) * math.expm1(x) if math.isfinite(x) else x for x in (low, high))
        return {"test": "sign-flip permutation of per-block NLL", "p_value": flip.p_value, "ci_low": low,
                "ci_high": high, "n_resamples": n_resamples}
    raise ConfigError(f"no significance test for metric {base.metric!r}; "
                      "allowed: accuracy, f1, matthews, bleu, perplexity, nll")


def perplexity_ratio(base: EvalResult, other: EvalResult, *, n_resamples: int = 1000, seed: int = 0,
                     ci_alpha: float = CI_ALPHA) -> dict:
    """``other``'s perplexity over ``base``'s on the same blocks, with its paired bootstrap interval.

    The blocks are resampled with replacement, the same draw for both models (:func:`paired_bootstrap` of the
    NLL per token, from each block's NLL sum and token count); the ratio is ``exp`` of the NLL difference, so
    its interval is ``exp`` of the difference's (``1 - ci_alpha``; the interval excludes 1 exactly when the
    centred bootstrap p is below ``ci_alpha``). Returns {"ratio", "ci_low", "ci_high", "p_value", "n" (blocks),
    "n_resamples", "seed", "ci_alpha"}."""
    for result, name in ((base, "base"), (other, "other")):
        if result.metric not in ("perplexity", "nll") or "nll_sum" not in result.per_example:
            raise ConfigError(f"{name}: a {result.metric!r} result; allowed: a perplexity or NLL result with "
                              "per-block NLL sums (LanguageModelling.evaluate)")
    if base.n != other.n:
        raise ConfigError(f"other: {other.n} blocks, base {base.n}; allowed: the same blocks")
    stats = [np.stack([np.asarray(r.per_example["nll_sum"], dtype=np.float64),
                       np.asarray(r.per_example["tokens"], dtype=np.float64)], axis=1) for r in (base, other)]  # [n, 2]
    boot = paired_bootstrap(stats[0], stats[1], lambda s: float(s[0] / s[1]), n_resamples=n_resamples, seed=seed,
                            ci_alpha=ci_alpha)
    return {"ratio": math.exp(boot.delta), "ci_low": math.exp(boot.ci_low), "ci_high": math.exp(boot.ci_high),
            "p_value": boot.p_value, "n": boot.n, "n_resamples": n_resamples, "seed": seed, "ci_alpha": ci_alpha}


def _perm(name: str, perm: PermutationResult, boot: BootstrapResult) -> dict:
    return {"test": name, "p_value": perm.p_value, "ci_low": perm.ci_low, "ci_high": perm.ci_high,
            "n_resamples": perm.n_resamples, "p_bootstrap": boot.p_value}
