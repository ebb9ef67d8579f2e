"""The demo chooses its pruning share on calibration text and checks the removed model against the masked one."""

from __future__ import annotations

import copy

import pytest
import torch

import headprune as hp
from headprune.errors import VerificationError
from headprune.experiments.demo import check_pruned, check_reloaded, choose_level, tiny_llama


def _curve(scores: dict[float, float]) -> list[dict]:
    rows = [{"order": "importance", "fraction": f, "pruned": round(f * 18), "score": s} for f, s in scores.items()]
    return rows + [{"order": "random", "fraction": 0.3, "pruned": 5, "score": 1.0}]  # random order never counts


def test_choose_level_largest_qualifying_step_or_nothing():
    assert choose_level(_curve({0.0: 10.0, 0.1: 10.5, 0.2: 10.99, 0.3: 11.2}), 0.10) == 0.2
    assert choose_level(_curve({0.0: 10.0, 0.1: 11.5, 0.2: 12.0}), 0.10) == 0.0  # no forced minimum
    assert choose_level(_curve({0.0: 10.0, 0.5: 10.0, 0.7: 10.0}), 0.10) == 0.5  # never more than half


def test_check_pruned_accepts_exact_removal_and_refuses_a_wrong_one():
    model, _ = tiny_llama()
    site = hp.find_sites(model)[0].name
    batch = {"input_ids": torch.randint(3, 90, (2, 16)), "attention_mask": torch.ones(2, 16, dtype=torch.long)}
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, {site: [0, 1]})
    ok = check_pruned(model, pruned, {site: [0, 1]}, batch)
    assert ok["max_abs_diff"] <= ok["tolerance"] and ok["tolerance"] == pytest.approx(1e-4 * ok["max_abs_logit"])
    with pytest.raises(VerificationError, match="differ from the masked model"):
        check_pruned(model, pruned, {site: [2, 3]}, batch)  # removed heads 0, 1 but claims 2, 3


def test_check_reloaded_accepts_the_saved_model_and_refuses_another(tmp_path):
    """The demo's save/load step: the model loaded back must compute what the pruned one did."""
    model, _ = tiny_llama()
    site = hp.find_sites(model)[0].name
    batch = {"input_ids": torch.randint(3, 90, (2, 16)), "attention_mask": torch.ones(2, 16, dtype=torch.long)}
    hp.prune_heads(model, {site: [0, 1]})
    hp.save_pruned(model, tmp_path / "m")
    ok = check_reloaded(model, hp.load_pruned(tmp_path / "m"), batch)
    assert ok["max_abs_diff"] <= ok["tolerance"]
    other = hp.load_pruned(tmp_path / "m")
    with torch.no_grad():
        other.lm_head.weight[0] += 1.0  # a hand-changed weight: a wrong reload
    with pytest.raises(VerificationError, match="loaded back"):
        check_reloaded(model, other, batch)
