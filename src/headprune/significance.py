"""Is the difference between two evaluations of the same examples significant?

Dispatches on the metric: accuracy -> paired t-test on per-example correctness (the paper's test)
plus a paired bootstrap; F1 / Matthews -> paired bootstrap of the corpus metric; BLEU -> paired
bootstrap of corpus BLEU from sentence statistics (Koehn 2004, as sacrebleu / compare-mt);
perplexity -> paired bootstrap of corpus perplexity from per-block NLL sums.
"""

from __future__ import annotations

import math

import numpy as np

from . import stats
from .errors import ConfigError
from .tasks.base import EvalResult


def compare(base: EvalResult, other: EvalResult, *, n_resamples: int = 1000, seed: int = 0) -> dict:
    """{"test": name, "p_value": p, "ci_low", "ci_high"} for ``other`` against ``base`` (same examples)."""
    if base.n != other.n or base.metric != other.metric:
        raise ConfigError(f"cannot compare {base.metric} on {base.n} examples with {other.metric} on {other.n}")
    a, b = base.per_example, other.per_example
    if base.metric == "accuracy" and "correct" in a:
        t = stats.paired_ttest(a["correct"], b["correct"])
        boot = stats.paired_bootstrap_accuracy(a["correct"], b["correct"], n_resamples=n_resamples, seed=seed)
        return {"test": "paired t-test (per-example correctness)", "p_value": t.p_value,
                "p_bootstrap": boot.p_value, "ci_low": boot.ci_low, "ci_high": boot.ci_high}
    if base.metric in ("f1", "matthews") and "pred" in a:
        boot = stats.paired_bootstrap_classification(a["pred"], b["pred"], a["label"], metric=base.metric,
                                                     n_resamples=n_resamples, seed=seed)
        return _boot("paired bootstrap", boot)
    if base.metric == "bleu" and "bleu_stats" in a:
        from .tasks.translation import bleu_from_stats

        boot = stats.paired_bootstrap(a["bleu_stats"], b["bleu_stats"], bleu_from_stats, n_resamples=n_resamples,
                                      seed=seed, reduce="sum")
        return _boot("paired bootstrap (corpus BLEU)", boot)
    if base.metric in ("perplexity", "nll") and "nll_sum" in a:
        sa = np.stack([a["nll_sum"], a["tokens"]], axis=1)
        sb = np.stack([b["nll_sum"], b["tokens"]], axis=1)
        corpus = (lambda s: math.exp(s[0] / s[1])) if base.metric == "perplexity" else (lambda s: s[0] / s[1])
        boot = stats.paired_bootstrap(sa, sb, corpus, n_resamples=n_resamples, seed=seed, reduce="sum")
        return _boot(f"paired bootstrap (corpus {base.metric})", boot)
    raise ConfigError(f"no significance test for metric {base.metric!r}; "
                      "allowed: accuracy, f1, matthews, bleu, perplexity, nll")


def _boot(name: str, boot) -> dict:
    return {"test": name, "p_value": boot.p_value, "ci_low": boot.ci_low, "ci_high": boot.ci_high}
