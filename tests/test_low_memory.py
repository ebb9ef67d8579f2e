"""``PruneSettings(low_memory=True)``: the selected configuration (Fisher scores, linear stand-ins) pruned in place,
with activation checkpointing and the stand-ins' second moments gathered one block at a time
(:mod:`headprune.compression.blockwise`), gives the normal path's model; the moments each block's stand-ins read
equal numpy's moments of inputs captured by plain hooks on the unpruned model; what needs the unpruned model is
refused; the CLI flag runs end to end."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import headprune as hp
from headprune.compression import Distill, Linear, PruneSettings, compress
from headprune.errors import ConfigError
from test_fluctuation import _batches, _real_inputs, _units, cli_fixture
from tiny import SEQ2SEQ, build, inputs, labels

SELECTED = dict(units="both", share=0.25, price="params", scores="fisher", compensate=Linear(damping=0.3), seq_len=16)


def _probe(family):
    probe = inputs(family, batch=3, seed=7)
    return {**probe, "labels": labels(family, probe, seed=7)} if family in SEQ2SEQ else probe


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> bool:
    if a.numel() == 0:  # an emptied site or FFN
        return a.shape == b.shape
    return float((a - b).abs().max()) <= rel * max(float(b.abs().max()), 1e-12)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "bart"])  # bart: the projection-by-projection fallback
def test_low_memory_gives_the_normal_path_model_in_place(family):
    model = build(family)
    batches = _batches(family, n=4)
    normal = compress(model, batches, PruneSettings(**SELECTED))
    passed = copy.deepcopy(model)
    low = compress(passed, batches, PruneSettings(**SELECTED, low_memory=True))
    assert low.model is passed  # pruned in place, no copy
    assert low.dropped_heads == normal.dropped_heads and low.dropped_neurons == normal.dropped_neurons
    assert any(low.dropped_neurons.values()) and any(low.dropped_heads.values())
    assert low.stages["linear"] == normal.stages["linear"] and low.stages["linear"].startswith("kept")
    a, b = dict(low.model.named_parameters()), dict(normal.model.named_parameters())
    assert a.keys() == b.keys()
    for name, p in a.items():  # the folded columns and biases included
        assert p.shape == b[name].shape and _close(p.detach(), b[name].detach()), name
    probe = _probe(family)
    with torch.no_grad():
        got, want = low.model(**probe).logits, normal.model(**probe).logits
        plain = compress(copy.deepcopy(model), batches, PruneSettings(**{**SELECTED, "compensate": "none"}))
        cut = plain.model(**probe).logits
    assert _close(got, want)
    assert not _close(cut, want, 1e-3)  # the stand-ins changed the model: the comparison is not of two no-ops
    assert low.sizes == normal.sizes


@dataclass(frozen=True)
class _Recording(Linear):
    """The linear stand-in, recording the moments it is handed (one block's at a time with low_memory)."""

    seen: tuple = ()

    def apply(self, pruned, model, stats, dropped_heads, dropped_neurons, settings) -> str:
        for name in stats.mean:
            self.seen[0][name] = (stats.mean[name].clone(), stats.second[name].clone(), stats.tokens[name])
        return super().apply(pruned, model, stats, dropped_heads, dropped_neurons, settings)


@pytest.mark.parametrize("family", ["llama", "bart"])
def test_each_block_gets_the_moments_of_the_unpruned_model(family):
    """Later blocks' moments are taken on the unpruned model's hidden states (the fold of a block comes after its
    outputs went on): numpy's moments of the inputs plain hooks capture on the unpruned model, padding excluded."""
    model = build(family)
    batches = _batches(family, n=3)
    real = _real_inputs(model, batches, _units(model))  # {name: [N, C]}, the test's own hooks
    seen: dict = {}
    settings = PruneSettings(**{**SELECTED, "compensate": _Recording(seen=(seen,))}, low_memory=True)
    result = compress(model, batches, settings)
    dropped = {k for k, v in (result.dropped_heads | result.dropped_neurons).items() if v}
    assert set(seen) == dropped and len(dropped) >= 3
    for name, (mean, second, tokens) in seen.items():
        x = real[name]
        assert tokens == x.shape[0]
        want_mean, want_second = x.mean(0), x.T @ x / x.shape[0]
        assert np.abs(mean.numpy() - want_mean).max() <= 1e-5 * np.abs(want_mean).max() + 1e-12, name
        assert np.abs(second.numpy() - want_second).max() <= 1e-5 * np.abs(want_second).max(), name


def test_what_needs_the_unpruned_model_is_refused():
    for extra, named in (({"compensate": ["linear", "reconstruct"]}, "compensate=\\['linear', 'reconstruct'\\]"),
                         ({"compensate": [Linear(damping=0.3), Distill()]}, "compensate=\\['linear', 'distill'\\]"),
                         ({"units": "heads", "price": "flops", "compensate": "none", "scores": "fisher"},
                          "the head plan")):
        with pytest.raises(ConfigError, match=f"low_memory=True with {named}.*allowed"):
            PruneSettings(**{**SELECTED, **extra}, low_memory=True)
    with pytest.raises(ConfigError, match="low_memory='yes'; allowed: True or False"):
        PruneSettings(**SELECTED, low_memory="yes")
    assert PruneSettings(**{**SELECTED, "compensate": "bias"}, low_memory=True).low_memory


def test_the_cli_flag_prunes_in_place_and_saves_the_normal_model(tmp_path):
    from typer.testing import CliRunner

    from headprune.cli import app

    base = [a if a != "fluctuation" else "fisher" for a in cli_fixture(tmp_path)]
    base += ["--compensate", "linear", "--damping", "0.3"]
    runner = CliRunner()
    models = {}
    for name, flags in (("normal", []), ("low", ["--low-memory"])):
        out = tmp_path / name
        result = runner.invoke(app, [*base, *flags, "-o", str(out)])
        assert result.exit_code == 0, result.output
        record = json.loads((out / "compress.json").read_text())
        assert record["settings"]["low_memory"] is (name == "low") and record["stages"]["linear"].startswith("kept")
        models[name] = hp.load_pruned(out)
    probe = inputs("bert", batch=2, seed=5)
    with torch.no_grad():
        assert _close(models["low"](**probe).logits, models["normal"](**probe).logits)
    refused = runner.invoke(app, [*[a for a in base if a != "--no-bench"], "--low-memory", "-o", str(tmp_path / "x")])
    assert refused.exit_code != 0 and "--low-memory without --no-bench" in refused.output
    assert not (tmp_path / "x").exists()
