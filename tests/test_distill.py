"""Distillation after surgery (headprune.compression.distill): the loss it trains is the teacher-to-student
KL over real positions (checked against torch's own kl_div), it brings the pruned model closer to the
unpruned one, and compress keeps it only where the validation loss says so."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import headprune as hp
from headprune.compression import Distill, PruneSettings, compress
from headprune.compression.distill import distill
from headprune.core.prune import prune_neurons
from headprune.errors import ConfigError
from tiny import build, inputs, labels


def _batches(family, n=3, batch=4):
    return [{**x, "labels": labels(family, x, seed=s)} for s in range(n) for x in [inputs(family, batch=batch, seed=s)]]


def _pruned(family):
    teacher = build(family)
    head = teacher.get_output_embeddings() or teacher.classifier
    with torch.no_grad():  # a random tiny model's outputs are nearly uniform: sharpen them
        head.weight.mul_(30.0)
    student = copy.deepcopy(teacher)
    hp.prune_heads(student, {hp.find_sites(student)[0].name: [0]}, verify=False)
    prune_neurons(student, {f.name: list(range(0, f.width, 2)) for f in hp.find_ffns(student)})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # and move the student further off the teacher than pruning a random model does
        for p in student.parameters():
            p.add_(0.3 * p.std().nan_to_num(0.0) * torch.randn(p.shape, generator=g))
    return teacher, student


def _reference_kl(teacher, student, batch, family) -> float:
    """KL(teacher || student) over real positions, by torch's kl_div, positions chosen by hand."""
    x = {k: v for k, v in batch.items() if k != "labels" or family in ("bart", "t5")}
    with torch.no_grad():
        t, s = teacher(**x).logits, student(**x).logits
    if t.dim() == 2:
        return float(F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True, reduction="batchmean"))
    real = batch["labels"] != -100 if family in ("bart", "t5") else batch["attention_mask"].bool()
    per = F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    return float(per[real].mean())


@pytest.mark.parametrize("family", ["bert", "llama", "bart"])
def test_first_step_trains_the_kl_over_real_positions_and_training_lowers_it(family):
    teacher, student = _pruned(family)
    batches = _batches(family)
    if family == "bart":  # padded decoder positions must not count
        batches[0]["labels"][0, -2:] = -100
    want = _reference_kl(teacher, student, batches[0], family)
    before = sum(_reference_kl(teacher, student, b, family) for b in batches)
    out = distill(student, teacher, batches, epochs=8, lr=3e-4, shuffle=False)
    assert out["losses"][0] == pytest.approx(want, rel=1e-4)
    after = sum(_reference_kl(teacher, student, b, family) for b in batches)
    assert out["steps"] == 24 and after < 0.5 * before
    assert not student.training and all(p.requires_grad for p in student.parameters())


def test_the_teacher_is_left_alone_and_bad_values_are_refused():
    teacher, student = _pruned("bert")
    state = {k: v.clone() for k, v in teacher.state_dict().items()}
    distill(student, teacher, _batches("bert", n=1), lr=1e-3)
    assert all(torch.equal(state[k], v) for k, v in teacher.state_dict().items())
    for kwargs, message in (({"epochs": 0}, "epochs"), ({"lr": 0.0}, "lr=0.0"), ({"lr": float("nan")}, "lr")):
        with pytest.raises(ConfigError, match=message):
            distill(student, teacher, _batches("bert", n=1), **kwargs)
    with pytest.raises(ConfigError, match="batches: empty"):
        distill(student, teacher, [])
    with pytest.raises(ConfigError, match=r"^lr=-1.0; allowed"):
        PruneSettings(units="both", share=0.5, compensate=[Distill(lr=-1.0)])


def test_compress_keeps_distillation_only_where_the_validation_loss_drops():
    model = build("bert")
    batches = _batches("bert", n=6, batch=6)
    calib, val = batches[:4], batches[4:]
    result = compress(model, calib, PruneSettings(units="both", share=0.4, seq_len=12,
                                                  compensate=[Distill(epochs=4, lr=1e-3)]), val_batches=val)
    v = result.losses
    kept = v["distilled"] <= v["pruned"]
    assert result.stages["distill"].startswith("kept" if kept else "rejected")
    loss = hp.scoring.gradients.mean_loss(result.model, val)
    assert loss == pytest.approx(v["distilled"] if kept else v["pruned"], rel=1e-6)
    assert result.distillation["steps"] == 16 and "distill" in result.summary()
    plain = compress(model, calib, PruneSettings(units="both", share=0.4, seq_len=12, compensate="none"),
                     val_batches=val)
    assert "distill" not in plain.stages and plain.dropped_neurons == result.dropped_neurons
