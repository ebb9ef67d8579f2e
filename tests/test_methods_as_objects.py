"""Methods are objects: a scorer and a compensation written here, outside the package, plug into ``compress()``
as objects and run from the CLI by name after one registration call each.

References that share no code with the pipeline: the scorer's scores are known by construction, so the heads
and neurons removed are the lowest ones counted by hand; the compensation adds a constant to the classifier's
bias, so the compensated model's logits are the uncompensated model's plus that constant.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
import headprune.compression.compensation as compensation_registry
import headprune.scoring.registry as scorer_registry
from headprune.cli import app
from headprune.compression import PruneSettings, compress, register_compensation
from headprune.errors import ConfigError
from headprune.scoring.registry import register_scorer
from tiny import build, inputs, labels, word_tokenizer

runner = CliRunner()
SHIFT = 0.25


class PositionScorer:
    """Head h of site i scores 10 h + i (neuron j of FFN i: 10 j + i): the lowest-numbered units go first."""

    name = "position"
    plan, pool, fisher, label_free = True, True, False, True

    def __init__(self):
        self.calls = 0

    def score(self, model, batches, request):
        from headprune.scoring.scorer import UnitScores

        self.calls += 1
        heads = {s.name: torch.arange(s.num_heads, dtype=torch.float64) * 10 + i
                 for i, s in enumerate(hp.find_sites(model))}
        neurons = {f.name: torch.arange(f.width, dtype=torch.float64) * 10 + i
                   for i, f in enumerate(hp.find_ffns(model))} if request.units != "heads" else {}
        return UnitScores(heads, neurons)


class ShiftLogits:
    """A refit-stage compensation: adds SHIFT to the classifier's bias of the pruned model."""

    name = "shift-logits"
    stage = "refit"

    def apply(self, student, teacher, batches, settings, progress=False):
        with torch.no_grad():
            student.classifier.bias += SHIFT
        return []


@pytest.fixture
def registries(monkeypatch):
    """The registries as they are, restored after the test (registration is process-wide)."""
    monkeypatch.setattr(scorer_registry, "_REGISTRY", dict(scorer_registry._REGISTRY))
    monkeypatch.setattr(compensation_registry, "_REGISTRY", dict(compensation_registry._REGISTRY))


def _batches(n=4):
    out = []
    for s in range(n):
        x = inputs("bert", batch=4, seed=s)
        out.append({**x, "labels": labels("bert", x, seed=s)})
    return out


def test_a_scorer_object_feeds_the_head_plan():
    model, scorer = build("bert"), PositionScorer()
    result = compress(model, _batches(), PruneSettings(n_keep=4, scores=scorer, compensate="none", seq_len=8))
    sites = [s.name for s in hp.find_sites(model)]
    assert scorer.calls == 1
    assert result.dropped_heads == {sites[0]: [0, 1], sites[1]: [0, 1]}  # scores 0, 1, 10, 11: the four lowest
    assert result.settings["scores"] == "position" and result.settings["compensate"] == []


def test_a_scorer_and_a_compensation_object_run_through_the_budget_over_heads_and_neurons():
    model, batches = build("bert"), _batches()
    plain = compress(model, batches, PruneSettings(units="both", share=0.5, scores=PositionScorer(),
                                                   compensate="none", seq_len=8))
    shifted = compress(model, batches, PruneSettings(units="both", share=0.5, scores=PositionScorer(),
                                                     compensate=[ShiftLogits()], guard=False, seq_len=8))
    assert shifted.dropped_heads == plain.dropped_heads and shifted.dropped_neurons == plain.dropped_neurons
    for name, dropped in plain.dropped_neurons.items():  # the lowest-numbered neurons went first, in every FFN
        assert dropped == list(range(len(dropped))), (name, dropped)
    assert shifted.stages["shift-logits"].startswith("kept")
    x = inputs("bert", seed=9)
    with torch.no_grad():
        want, got = plain.model(**x).logits + SHIFT, shifted.model(**x).logits
    assert (got - want).abs().max() <= 1e-6


def test_objects_that_miss_what_the_protocol_declares_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="not a Scorer"):
        PruneSettings(share=0.5, scores=object())
    with pytest.raises(ConfigError, match="not a Compensation"):
        PruneSettings(units="both", share=0.5, compensate=[object()])
    with pytest.raises(ConfigError, match="at most one stand-in"):
        PruneSettings(units="both", share=0.5, compensate=["reconstruct", "bias"])


def test_registered_by_name_they_run_from_the_cli(registries, tmp_path):
    texts = ["a good film", "a bad film", "the plot was thin", "wonderful acting", "dull and long", "loved it"]
    model = build("bert")
    hp.save_pruned(model, tmp_path / "model", tokenizer=word_tokenizer(texts))
    for name, rows in (("dev.tsv", texts), ("train.tsv", texts[::-1] * 2)):
        (tmp_path / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(rows)))
    register_scorer(PositionScorer())
    register_compensation(ShiftLogits())
    out = tmp_path / "out"
    result = runner.invoke(app, ["compress", str(tmp_path / "model"), "--task", "classification", "--data",
                                 str(tmp_path / "dev.tsv"), "--calib-data", str(tmp_path / "train.tsv"), "--units",
                                 "both", "--share", "0.5", "--scores", "position", "--compensate", "shift-logits",
                                 "--no-guard", "--seq-len", "8", "--no-bench", "-o", str(out)])
    assert result.exit_code == 0, result.output
    record = json.loads((out / "compress.json").read_text())
    assert record["settings"]["scores"] == "position" and record["settings"]["compensate"] == ["shift-logits"]
    assert record["stages"]["shift-logits"].startswith("kept")
    with pytest.raises(ConfigError, match="name 'position' is taken"):
        register_scorer(type("Other", (PositionScorer,), {})())


def test_the_cli_help_names_every_built_in_method():
    from headprune.compression.compensation import compensation_names
    from headprune.scoring.registry import scorer_names

    help_text = " ".join(runner.invoke(app, ["compress", "--help"], terminal_width=400,
                                       env={"COLUMNS": "400"}).output.replace("│", " ").split())
    for name in (*scorer_names(), *compensation_names()):
        assert f"{name} (" in help_text or f"{name}," in help_text or f"{name};" in help_text, name
