"""``PruneSettings(steps=k)``: k rounds of score, select, stand-in and cut, each on the model the round before left.
Checked against two public ``compress`` calls made here (the second on the first's model, its share computed here
from parameter counts), and the dropped indices against the weights: with no compensation a kept neuron's column of
the down projection is the unpruned one's."""

from __future__ import annotations

import re

import pytest
import torch

import headprune as hp
from headprune.compression import Linear, PruneSettings, compress
from headprune.errors import ConfigError
from tiny import build, inputs, labels

BASE = dict(units="both", price="params", scores="fisher", seq_len=16)
OBS = Linear(variant="obs-seq", damping=0.01)


def _batches(n=3):
    out = []
    for s in range(n):
        x = inputs("llama", batch=5, seed=s, pad=False)
        out.append({**x, "labels": labels("llama", x, seed=s)})
    return out


def _pool_params(model) -> int:
    """Parameters of the blocks' weight matrices (q, k, v, o, gate, up, down: what heads and neurons are priced in)."""
    return sum(p.numel() for p in model.model.layers.parameters() if p.dim() == 2)


def test_two_rounds_equal_two_calls_on_the_smaller_model():
    torch.manual_seed(0)
    model, batches = build("llama"), _batches()
    share = 0.5
    got = compress(model, batches, PruneSettings(**BASE, share=share, compensate=OBS, steps=2))
    p0 = _pool_params(model)
    first = compress(model, batches, PruneSettings(**BASE, share=1 - (1 - share) / 2, compensate=OBS))
    second = compress(first.model, batches, PruneSettings(**BASE, share=p0 * share / _pool_params(first.model),
                                                          compensate=OBS))
    probe = inputs("llama", batch=3, seed=9, pad=False)
    with torch.no_grad():
        a, b = got.model(**probe).logits, second.model(**probe).logits
    assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())
    assert _pool_params(got.model) <= share * p0
    assert "steps" in got.selection and len(got.selection["steps"]) == 2


@pytest.mark.parametrize("low_memory", [False, True])
def test_dropped_indices_are_of_the_model_passed(low_memory):
    """Also with ``low_memory`` (the first round cuts the model passed in place): the indices are still of the model
    as it was passed, read here from weights copied before the call."""
    torch.manual_seed(0)
    model, batches = build("llama"), _batches()
    before = {f.name: f.down.weight.detach().clone() for f in hp.find_ffns(model)}
    width = {s.name: s.num_heads for s in hp.find_sites(model)}
    got = compress(model, batches, PruneSettings(**BASE, share=0.4, compensate="none", steps=3, low_memory=low_memory))
    assert any(got.dropped_neurons.values()) and any(got.dropped_heads.values())
    for ffn in hp.find_ffns(got.model):
        kept = [j for j in range(before[ffn.name].shape[1]) if j not in set(got.dropped_neurons[ffn.name])]
        assert torch.equal(ffn.down.weight.detach(), before[ffn.name][:, kept])
    assert got.plan.dropped_neurons == got.dropped_neurons
    for site in hp.find_sites(got.model):
        assert site.num_heads == width[site.name] - len(got.dropped_heads[site.name])


def test_steps_refused_where_they_cannot_run():
    with pytest.raises(ConfigError, match="steps=2 with the head plan"):
        PruneSettings(units="heads", share=0.5, steps=2)
    with pytest.raises(ConfigError, match="steps=0"):
        PruneSettings(**BASE, share=0.5, steps=0)
    model = build("llama")
    prices = hp.compression.pool.unit_costs(model, "params")
    with pytest.raises(ConfigError, match="prices= with steps=2"):
        compress(model, _batches(1), PruneSettings(units="both", price="latency", share=0.5, steps=2), prices=prices)


def _affine_reference(model, batches, dropped_heads, dropped_neurons):
    """A copy of ``model`` with every removed feature of an output / down projection replaced by its least-squares
    affine prediction from the kept ones on ``batches`` (numpy ``lstsq`` on the inputs hooks record here), the removed
    columns zeroed (what cutting them computes) and the shift added by a forward hook."""
    import copy

    import numpy as np

    ref = copy.deepcopy(model)
    targets = {s.name: (s.o, [j for h in dropped_heads.get(s.name, ()) for j in range(h * s.head_dim, (h + 1) * s.head_dim)])
               for s in hp.find_sites(model)}
    targets |= {f.name: (f.down, list(dropped_neurons.get(f.name, ()))) for f in hp.find_ffns(model)}
    seen = {name: [] for name in targets}
    hooks = [module.register_forward_pre_hook(lambda _m, a, name=name: seen[name].append(a[0].reshape(-1, a[0].shape[-1])))
             for name, (module, _) in targets.items()]
    with torch.no_grad():
        for b in batches:
            model(**{k: v for k, v in b.items() if k != "labels"})
    for h in hooks:
        h.remove()
    mine = {s.name: s.o for s in hp.find_sites(ref)} | {f.name: f.down for f in hp.find_ffns(ref)}
    for name, (_, removed) in targets.items():
        if not removed:
            continue
        x = torch.cat(seen[name]).double().numpy()
        kept = [j for j in range(x.shape[1]) if j not in set(removed)]
        design = np.hstack([x[:, kept], np.ones((x.shape[0], 1))])
        coef = np.linalg.lstsq(design, x[:, removed], rcond=None)[0]  # [k + 1, r]
        w = mine[name].weight.detach().double().numpy()
        new = w.copy()
        new[:, kept] += w[:, removed] @ coef[:-1].T
        new[:, removed] = 0
        shift = torch.tensor(w[:, removed] @ coef[-1], dtype=torch.float32)
        with torch.no_grad():
            mine[name].weight.copy_(torch.tensor(new, dtype=torch.float32))
        mine[name].register_forward_hook(lambda _m, _a, out, s=shift: out + s)
    return ref


def test_step_standin_rounds_choose_then_one_fold_on_the_model_passed():
    """``step_standin``: the rounds (folding ``linear``, damping 0.3) choose what the plain rounds choose; the
    settings' own stand-in (``linear``, no ridge) is then fitted once on the model passed, equal to numpy's
    least-squares stand-ins on the unpruned model's inputs."""
    torch.manual_seed(0)
    model, batches = build("llama"), _batches(4)
    rounds = compress(model, batches, PruneSettings(**BASE, share=0.5, compensate=Linear(damping=0.3), steps=2))
    got = compress(model, batches, PruneSettings(**BASE, share=0.5, compensate=Linear(damping=0.0), steps=2,
                                                 step_standin=Linear(damping=0.3)))
    assert got.dropped_heads == rounds.dropped_heads and got.dropped_neurons == rounds.dropped_neurons
    assert any(got.dropped_neurons.values())
    ref = _affine_reference(model, batches, got.dropped_heads, got.dropped_neurons)
    probe = inputs("llama", batch=3, seed=9, pad=False)
    with torch.no_grad():
        a, b, c = got.model(**probe).logits, ref(**probe).logits, rounds.model(**probe).logits
    scale = float(b.abs().max())
    assert float((a - b).abs().max()) <= 1e-4 * scale
    assert float((c - b).abs().max()) > 1e-3 * scale  # folded round by round, the model differs: the check can fail


def test_step_standin_three_rounds_choose_what_plain_rounds_choose():
    """Three rounds: the last one only chooses (no fold, no cut); its choice, given as indices of the model the
    second round left, is mapped back to the model passed through both earlier cuts."""
    torch.manual_seed(1)
    model, batches = build("llama"), _batches(4)
    rounds = compress(model, batches, PruneSettings(**BASE, share=0.4, compensate=Linear(damping=0.3), steps=3))
    got = compress(model, batches, PruneSettings(**BASE, share=0.4, compensate="linear", steps=3,
                                                 step_standin=Linear(damping=0.3)))
    assert got.dropped_heads == rounds.dropped_heads and got.dropped_neurons == rounds.dropped_neurons
    assert len(got.selection["steps"]) == 3 and any(got.dropped_neurons.values())


def test_obs_seq_once_after_linear_rounds():
    """``obs-seq`` run once after the rounds re-chooses units among all of the model passed, as many per FFN and
    key/value group as the rounds dropped; the indices are of the model passed and match its weights."""
    torch.manual_seed(0)
    model, batches = build("llama"), _batches(4)
    before = {f.name: f.down.weight.detach().clone() for f in hp.find_ffns(model)}
    rounds = compress(model, batches, PruneSettings(**BASE, share=0.5, compensate=Linear(damping=0.3), steps=2))
    got = compress(model, batches, PruneSettings(**BASE, share=0.5, compensate=OBS, steps=2,
                                                 step_standin=Linear(damping=0.3)))
    for name, drop in rounds.dropped_neurons.items():
        assert len(got.dropped_neurons[name]) == len(drop)
    for name, drop in rounds.dropped_heads.items():
        assert len(got.dropped_heads[name]) == len(drop)
    for ffn in hp.find_ffns(got.model):
        assert ffn.down.weight.shape[1] == before[ffn.name].shape[1] - len(got.dropped_neurons[ffn.name])
    assert got.selection["step_standin"] == {"name": "linear", "damping": 0.3} and len(got.selection["steps"]) == 2
    assert got.plan.dropped_neurons == got.dropped_neurons


def test_score_batches_scores_on_batches_spread_over_the_order():
    """``score_batches=2`` of 4 scores on the 1st and 3rd: the units dropped with no compensation are those of a
    call given only those two batches."""
    torch.manual_seed(0)
    model, batches = build("llama"), _batches(4)
    got = compress(model, batches, PruneSettings(**BASE, share=0.6, compensate="none", score_batches=2))
    ref = compress(model, [batches[0], batches[2]], PruneSettings(**BASE, share=0.6, compensate="none"))
    every = compress(model, batches, PruneSettings(**BASE, share=0.6, compensate="none"))
    assert got.dropped_neurons == ref.dropped_neurons and got.dropped_heads == ref.dropped_heads
    assert (every.dropped_neurons, every.dropped_heads) != (ref.dropped_neurons, ref.dropped_heads)


def test_score_batches_per_round_equal_two_calls_on_their_batches():
    """``score_batches=[2, 1]`` in two rounds (no compensation): the first round scores on the 1st and 3rd of 4
    batches, the second on the 1st: two public calls given those batches, the second on the first's model with its
    share computed here from parameter counts, leave the same model."""
    torch.manual_seed(0)
    model, batches = build("llama"), _batches(4)
    share = 0.5
    got = compress(model, batches, PruneSettings(**BASE, share=share, compensate="none", steps=2, score_batches=[2, 1]))
    p0 = _pool_params(model)
    first = compress(model, [batches[0], batches[2]], PruneSettings(**BASE, share=1 - (1 - share) / 2,
                                                                     compensate="none"))
    second = compress(first.model, [batches[0]], PruneSettings(**BASE, share=p0 * share / _pool_params(first.model),
                                                               compensate="none"))
    probe = inputs("llama", batch=3, seed=9, pad=False)
    with torch.no_grad():
        a, b = got.model(**probe).logits, second.model(**probe).logits
    assert a.shape == b.shape and float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())
    same = compress(model, batches, PruneSettings(**BASE, share=share, compensate="none", steps=2, score_batches=2))
    assert (same.dropped_heads, same.dropped_neurons) != (got.dropped_heads, got.dropped_neurons)


def test_score_batches_per_round_round_trip_through_toml(tmp_path):
    settings = PruneSettings(**BASE, share=0.5, compensate="linear", steps=3, score_batches=(2, 1, 0))
    assert settings.score_batches == [2, 1, 0] and settings.to_dict()["score_batches"] == [2, 1, 0]
    path = tmp_path / "s.toml"
    path.write_text(settings.to_toml())
    assert PruneSettings.from_toml(path).to_dict() == settings.to_dict()


@pytest.mark.parametrize(("given", "message"), [
    (dict(step_standin="linear"), "step_standin='linear' with steps=1"),
    (dict(steps=2, step_standin="linear", low_memory=True), "step_standin='linear' with low_memory=True"),
    (dict(steps=2, step_standin="reconstruct"), "step_standin='reconstruct'; allowed: None or a stand-in"),
    (dict(steps=2, step_standin={"name": "linear", "damping": -1.0}), "damping=-1.0; allowed"),
    (dict(steps=2, step_standin=["linear"]), "step_standin=['linear']; allowed: None or a stand-in"),
    (dict(score_batches=-1), "score_batches=-1"),
    (dict(steps=2, score_batches=[2]), "score_batches=[2]; allowed: an integer >= 0, or a list of 2 of them"),
    (dict(steps=2, score_batches=[2, -1]), "score_batches=[2, -1]; allowed"),
    (dict(steps=2, score_batches=[2, 1.5]), "score_batches=[2, 1.5]; allowed"),
])
def test_step_settings_refused_with_one_line(given, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        PruneSettings(**BASE, share=0.5, compensate=given.pop("compensate", "obs-seq"), **given)


def test_score_batches_refused_with_the_head_plan():
    with pytest.raises(ConfigError, match="score_batches=2 with the head plan"):
        PruneSettings(units="heads", share=0.5, score_batches=2)
    with pytest.raises(ConfigError, match=r"score_batches=\[1\] with the head plan"):
        PruneSettings(units="heads", share=0.5, score_batches=[1])


def test_cli_step_flags_reach_the_settings_and_are_refused_by_flag_name(tmp_path):
    """On a BERT classifier (an encoder: the final stand-in ``linear`` needs no block replay): the flags reach the
    recorded settings; a step stand-in without rounds is refused in one line naming the flags, nothing written."""
    from typer.testing import CliRunner

    from headprune.cli import app
    from test_fluctuation import cli_fixture

    base = [a if a != "fluctuation" else "fisher" for a in cli_fixture(tmp_path)]
    runner = CliRunner()
    out = tmp_path / "out"
    result = runner.invoke(app, [*base, "--compensate", "linear", "--damping", "0.3", "--steps", "2",
                                 "--step-standin", "bias", "--score-batches", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    record = __import__("json").loads((out / "compress.json").read_text())
    assert record["settings"]["step_standin"] == "bias" and record["settings"]["score_batches"] == 1
    assert record["stages"]["linear"].startswith("kept") and record["selection"]["step_standin"] == "bias"
    refused = runner.invoke(app, [*base, "--compensate", "linear", "--step-standin", "bias", "-o", str(tmp_path / "x")])
    assert refused.exit_code != 0 and "--step-standin 'bias' with --steps 1" in refused.output
    assert not (tmp_path / "x").exists()
    per_round = tmp_path / "rounds"
    result = runner.invoke(app, [*base, "--compensate", "linear", "--steps", "2", "--score-batches", "1,0",
                                 "-o", str(per_round)])
    assert result.exit_code == 0, result.output
    assert __import__("json").loads((per_round / "compress.json").read_text())["settings"]["score_batches"] == [1, 0]
    for words, message in (("1,x", "--score-batches '1,x'; allowed: an integer >= 0"),
                           ("1,0,2", "--score-batches [1, 0, 2]; allowed: an integer >= 0, or a list of 2")):
        refused = runner.invoke(app, [*base, "--compensate", "linear", "--steps", "2", "--score-batches", words,
                                      "-o", str(tmp_path / "y")])
        assert refused.exit_code != 0 and message in refused.output, refused.output
        assert not (tmp_path / "y").exists()
