"""One budget type: ``Budget.of`` is the one validation every selection function and PruneSettings read their
budget through, and the counts it removes are the hand-counted ones."""

from __future__ import annotations

import math

import pytest
import torch

from headprune.compression import PruneSettings
from headprune.errors import ConfigError
from headprune.selection.budget import budget_heads
from headprune.selection.budgets import Budget
from headprune.selection.gqa import select_gqa
from headprune.selection.units import select_units


@pytest.mark.parametrize("keyword, amount, total, removed", [
    ("n_drop", 3, 10, 3), ("n_keep", 3, 10, 7), ("fraction", 0.25, 8, 2), ("keep", 0.25, 8, 6),
    ("keep", 1.0, 5, 0), ("fraction", 0.0, 5, 0), ("n_keep", 0, 4, 4),
])
def test_counts_removed_are_the_hand_counted_ones(keyword, amount, total, removed):
    assert Budget.of(**{keyword: amount}).count_removed(total) == removed


@pytest.mark.parametrize("given, pattern", [
    (dict(keep=0.5, n_keep=2), "exactly one budget: keep= or n_keep="),
    (dict(keep=None, n_keep=None), "exactly one budget.*got none"),
    (dict(keep=1.5), r"keep=1.5; allowed"),
    (dict(keep=math.nan), r"keep=nan; allowed"),
    (dict(n_keep=-1), r"n_keep=-1; allowed: an integer >= 0"),
    (dict(n_keep=True), r"n_keep=True; allowed"),
    (dict(n_keep=2.0), r"n_keep=2.0; allowed"),
])
def test_one_validation_names_the_keyword_the_value_and_what_is_allowed(given, pattern):
    with pytest.raises(ConfigError, match=pattern):
        Budget.of(**given)


def test_a_count_above_the_pool_is_refused_when_the_pool_is_known():
    with pytest.raises(ConfigError, match=r"n_keep=9; allowed: an integer 0..8"):
        Budget.of(n_keep=9).count_removed(8)


def test_every_selection_function_refuses_a_bad_share_in_the_same_words():
    scores = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0, 0.5])}
    costs = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([1.0, 1.0])}
    calls = [lambda: select_gqa(scores, None, Budget.of(keep=1.5)),
                                lambda: budget_heads(scores, Budget.of(keep=1.5)),
             lambda: budget_heads(scores, Budget.of(flops=1.5), costs)]
    for call in calls:
        with pytest.raises(ConfigError, match=r"=1.5; allowed: a number 0.0..1.0"):
            call()
    from headprune.core.model.unit_cost import UnitCosts

    unit_costs = UnitCosts({k: v for k, v in costs.items()}, {}, "flops")
    with pytest.raises(ConfigError, match=r"share=1.5; allowed: a number 0.0..1.0"):
        select_units(scores, {}, unit_costs, Budget.of(share=1.5), units="heads")
    with pytest.raises(ConfigError, match=r"share=1.5; allowed: a number 0.0..1.0"):
        PruneSettings(share=1.5)


def test_prune_settings_carry_their_budget():
    assert PruneSettings(share=0.5, price="kv").budget == Budget("share", 0.5, True, False, "kv")
    assert PruneSettings(n_keep=3).budget.count_removed(8) == 5
    with pytest.raises(ConfigError, match=r"n_keep=0; allowed: an integer >= 1"):
        PruneSettings(n_keep=0)
