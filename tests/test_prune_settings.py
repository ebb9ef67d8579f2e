"""One compression entry point: ``compress(model, batches, PruneSettings(...))`` for heads, neurons or both.

The head plan removes the lowest-scored heads and computes what masking them computes; bad budgets are refused
before any scoring, naming the argument, the value and the allowed range.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import headprune as hp
from headprune.compression import CompressResult, PruneSettings, compress
from headprune.errors import ConfigError
from tiny import build, inputs, labels


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _batches(family, seeds=(1, 2), batch=4):
    out = []
    for s in seeds:
        x = inputs(family, batch=batch, seed=s)
        x["labels"] = labels(family, x)
        out.append(x)
    return out


def _never_read():
    raise AssertionError("the calibration batches were read: the refusal came too late")
    yield  # a generator: nothing runs until it is read


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_the_head_plan_removes_the_lowest_scored_heads_and_equals_the_masked_model(family):
    """Reference: I_h from headprune.head_importance ranked by hand, and the unpruned model under a hand-built mask."""
    model = build(family)
    batches = _batches(family)
    result = compress(model, batches, PruneSettings(n_keep=4, price="count", scores="ih", compensate="none",
                                                    seq_len=8))
    assert isinstance(result, CompressResult)
    scores = hp.head_importance(model, batches)
    ranked = sorted((float(v[h]), name, h) for name, v in scores.items() for h in range(v.numel()))
    total = sum(v.numel() for v in scores.values())
    if family == "bert":  # no key/value groups: exactly the total - 4 lowest
        want = {}
        for _, name, h in ranked[:total - 4]:
            want.setdefault(name, []).append(h)
        assert {k: sorted(v) for k, v in result.dropped_heads.items() if v} == {k: sorted(v) for k, v in want.items()}
    assert sum(len(v) for v in result.kept_heads.values()) == 4
    mask = hp.mask_from_heads(hp.find_sites(model), result.dropped_heads)
    x = inputs(family)
    with torch.no_grad(), hp.masked(model, mask):
        want_logits = model(**x).logits
    with torch.no_grad():
        got = result.model(**x).logits
    assert (got - want_logits).abs().max() <= 1e-5 * want_logits.abs().max()


def test_new_entry_point_does_not_warn():
    model = build("bert")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        result = compress(model, _batches("bert"), PruneSettings(share=0.5, price="count", scores="ih", seq_len=8))
    assert sum(len(v) for v in result.dropped_heads.values()) == 4  # of 8 heads


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(share=0.0), r"share=0; allowed: a number in \(0, 1\]"),
    (dict(share=1.5), r"share=1.5; allowed: .*0.0..1.0"),
    (dict(n_keep=0), r"n_keep=0; allowed: .*integer >= 1"),
    (dict(share=0.5, n_keep=3), "exactly one budget"),
    ({}, "exactly one budget"),
    (dict(share=0.5, units="all"), "units='all'; allowed: heads, neurons, both"),
    (dict(share=0.5, scores="ih", compensate="tune"), "compensate='tune' with scores='ih'"),
    (dict(units="both", n_keep=10), "n_keep=10 with units='both'"),
    (dict(units="neurons", share=0.5, price="kv"), "price='kv' with units='neurons'"),
    (dict(share=0.5, price="flops", same_per_site=True), "same_per_site=True with"),
])
def test_bad_settings_are_refused_on_creation(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        PruneSettings(**kwargs)


def test_same_per_site_takes_a_head_count_whatever_the_price_says():
    counted = PruneSettings(n_keep=4, same_per_site=True)
    assert counted.budget == hp.Budget.of(n_keep=4)  # price keeps its default
    assert counted.head_rule() == hp.HeadRule(same_per_site=True)
    shared = PruneSettings(share=0.5, price="count", same_per_site=True, gqa="groups", min_per_site=1)
    assert shared.budget.count_removed(10) == 5  # half of 10 heads kept
    assert shared.head_rule(["encoder.0.self"]) == hp.HeadRule("groups", 1, ("encoder.0.self",), True)


def test_a_count_above_the_model_heads_is_refused_before_reading_the_batches():
    model = build("bert")  # 2 sites x 4 heads
    with pytest.raises(ConfigError, match=r"n_keep=500; allowed: an integer 1..8"):
        compress(model, _never_read(), PruneSettings(n_keep=500))
    with pytest.raises(ConfigError, match=r"n_keep=5; allowed: an integer 1..4 .* in sites"):
        compress(model, _never_read(), PruneSettings(n_keep=5), sites=[hp.find_sites(model)[0].name])


def test_arguments_a_pipeline_cannot_use_are_refused_not_dropped():
    model = build("bert")
    batches = _batches("bert")
    with pytest.raises(ConfigError, match="val_batches: not used by the head plan"):
        compress(model, batches, PruneSettings(share=0.5), val_batches=batches)
    with pytest.raises(ConfigError, match="sites: not used by units='both'"):
        compress(model, batches, PruneSettings(units="both", share=0.5), sites=["encoder.0.self"])
    with pytest.raises(ConfigError, match="settings=dict; allowed: PruneSettings"):
        compress(model, batches, {"share": 0.5})


def test_replay_kept_heads_equals_the_masked_model_and_the_former_name_is_gone():
    model = build("bert")
    kept = {s.name: [0, 2] for s in hp.find_sites(model)}
    fresh = build("bert")
    assert hp.replay_kept_heads(fresh, kept) == kept
    assert not hasattr(hp, "keep_heads")  # removed in 0.3.0 (CHANGELOG.md)
    x = inputs("bert")
    mask = hp.mask_from_heads(model, {s.name: [1, 3] for s in hp.find_sites(model)})
    with torch.no_grad(), hp.masked(model, mask):
        want = model(**x).logits
    with torch.no_grad():
        assert (fresh(**x).logits - want).abs().max() <= 1e-5 * want.abs().max()


def test_the_readme_selection_never_grows_a_gqa_kv_cache():
    """README quick start: select_heads(scores, kv_groups(model), fraction=...) on a GQA model drops the same
    number of query heads in every key/value group, for every fraction and random scores."""
    from headprune.selection.gqa import kv_growth

    model = build("llama")
    groups = hp.kv_groups(model)
    assert any(len(set(g)) < len(g) for g in groups.values())  # the tiny Llama has GQA
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        scores = {name: torch.rand(len(v), generator=g) for name, v in groups.items()}
        for fraction in (0.25, 0.4, 0.5, 0.75):
            drop = hp.select_heads(scores, groups, hp.Budget.of(fraction=fraction),
                                   hp.HeadRule(min_per_site=1))
            assert kv_growth(drop, groups)[0] <= 1.0
            for name, heads in drop.items():
                per_group = [sum(1 for h in heads if groups[name][h] == j) for j in set(groups[name])]
                assert len(set(per_group)) == 1, (name, drop)
