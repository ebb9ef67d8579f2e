"""Linear stand-ins (``compensate="linear"``): the fold equals numpy's least squares on the removed features;
a model compensated with them equals the unpruned model whose removed inputs are replaced, by the test's own
hooks, with their regression on the kept inputs (fitted by numpy on inputs the test captured); on the
calibration tokens each projection's output moves less than with the mean stand-in; compress runs it in the
statistics' one pass, meets the budget, and the result saves and loads to the same logits."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import headprune as hp
from headprune.compression import PruneSettings, compress
from headprune.core.cut.biases import mean_shifts, shift_biases
from headprune.core.cut.standins import affine_standin, linear_standins
from headprune.errors import ConfigError, PlanError
from headprune.scoring.fluctuation import channel_stats
from test_fluctuation import _batches, _real_inputs, _units, _weight, cli_fixture
from tiny import SEQ2SEQ, build, inputs, labels


def _data(seed=0, n=400, c=12, d_out=5):
    g = np.random.default_rng(seed)
    mix = g.normal(size=(c, c))
    x = g.normal(size=(n, c)) @ mix + g.normal(size=c) * 3  # correlated features, means far from 0
    return x, g.normal(size=(d_out, c))


def test_the_fold_equals_numpy_least_squares_of_the_projection_output():
    x, w = _data()
    removed = np.array([1, 4, 5, 9])
    kept = np.setdiff1d(np.arange(x.shape[1]), removed)
    mean, second = x.mean(0), x.T @ x / len(x)
    got_kept, delta, shift = affine_standin(torch.tensor(w), torch.tensor(mean), torch.tensor(second),
                                            torch.tensor(removed), damping=0.0)
    assert got_kept.tolist() == kept.tolist()
    # numpy: the best affine function of the kept features for what the removed ones added, W_R x_R
    design = np.concatenate([x[:, kept], np.ones((len(x), 1))], 1)
    coef, *_ = np.linalg.lstsq(design, x[:, removed] @ w[:, removed].T, rcond=None)
    want_delta, want_shift = coef[:-1].T, coef[-1]
    assert np.abs(delta.numpy() - want_delta).max() <= 1e-8 * np.abs(want_delta).max()
    assert np.abs(shift.numpy() - want_shift).max() <= 1e-8 * np.abs(want_shift).max()
    # on these tokens the output moves less than with the mean stand-in (FLAP's bias), and much less here
    y = x @ w.T
    linear = x[:, kept] @ (w[:, kept] + want_delta).T + want_shift
    held = x[:, kept] @ w[:, kept].T + w[:, removed] @ mean[removed]
    assert ((linear - y) ** 2).mean() < 0.5 * ((held - y) ** 2).mean()


def test_a_large_damping_is_the_mean_stand_in_and_an_empty_site_gets_the_mean():
    x, w = _data(seed=1)
    args = (torch.tensor(w), torch.tensor(x.mean(0)), torch.tensor(x.T @ x / len(x)))
    _, delta, shift = affine_standin(*args, torch.tensor([0, 2]), damping=1e9)
    mean_shift = w[:, [0, 2]] @ x.mean(0)[[0, 2]]
    assert float(delta.abs().max()) <= 1e-6 * np.abs(w).max()
    assert np.abs(shift.numpy() - mean_shift).max() <= 1e-6 * np.abs(mean_shift).max()
    kept, delta, shift = affine_standin(*args, torch.arange(w.shape[1]), damping=0.0)
    assert kept.numel() == 0 and delta.shape == (w.shape[0], 0)
    assert np.allclose(shift.numpy(), w @ x.mean(0), rtol=1e-12)


def _regressed(model, units, x, drop_h, drop_n, lam):
    """Pre-hooks replacing the dropped input features by their ridge regression on the kept ones, fitted by numpy
    on the captured inputs ``x`` ({name: [N, C]}); returns the handles."""
    handles = []
    for name, drop in {**drop_h, **drop_n}.items():
        _, module, width = units[name]
        cols = np.array([i * width + j for i in drop for j in range(width)])
        kept = np.setdiff1d(np.arange(x[name].shape[1]), cols)
        cov = np.cov(x[name], rowvar=False, bias=True)
        c_kk = cov[np.ix_(kept, kept)]
        ridge = lam * np.clip(np.diag(c_kk), 0, None).mean() if len(kept) else 0.0
        a = np.linalg.solve(c_kk + ridge * np.eye(len(kept)), cov[np.ix_(kept, cols)]).T if len(kept) else None
        mu = x[name].mean(0)

        def pre(_module, args, cols=torch.tensor(cols), kept=torch.tensor(kept), a=a, mu=torch.tensor(mu)):
            z = args[0].clone()
            value = mu[cols].expand(*z.shape[:-1], len(cols)).clone()
            if a is not None:
                value += (z[..., kept].double() - mu[kept]) @ torch.tensor(a).T
            z[..., cols] = value.to(z.dtype)
            return (z, *args[1:])
        handles.append(module.register_forward_pre_hook(pre))
    return handles


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "bart"])
def test_linear_stand_ins_equal_the_unpruned_model_with_regressed_inputs(family, tmp_path):
    model = build(family)
    batches = _batches(family, n=6)
    units = _units(model)
    x = _real_inputs(model, batches, units)
    sites, ffns = hp.find_sites(model), hp.find_ffns(model)
    drop_h = {sites[0].name: list(range(sites[0].num_heads)), sites[-1].name: [0]}  # one site loses every head
    drop_n = {ffns[0].name: [0, 3, 5], ffns[-1].name: list(range(0, ffns[-1].width, 2))}
    stats = channel_stats(model, batches, gram=True)
    lam = 1e-3
    pruned = copy.deepcopy(model)
    done = linear_standins(pruned, stats.mean, stats.second, drop_h, drop_n, damping=lam)
    assert done[sites[0].name] == 0 and done[ffns[0].name] == ffns[0].width - 3
    hp.prune_heads(pruned, drop_h)
    hp.prune_neurons(pruned, drop_n)
    probe = inputs(family, batch=3, seed=7)
    if family in SEQ2SEQ:
        probe = {**probe, "labels": labels(family, probe, seed=7)}
    handles = _regressed(model, units, x, drop_h, drop_n, lam)
    with torch.no_grad():
        want = model(**probe).logits
    for h in handles:
        h.remove()
    with torch.no_grad():
        got = pruned(**probe).logits
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= 1e-4 * scale
    # the mean stand-in is a different model, which the check can tell apart
    held = copy.deepcopy(model)
    shift_biases(held, mean_shifts(model, stats.mean, drop_h, drop_n))
    hp.prune_heads(held, drop_h)
    hp.prune_neurons(held, drop_n)
    with torch.no_grad():
        assert float((held(**probe).logits - want).abs().max()) > 1e-3 * scale
    # each projection's output on the calibration tokens moves less than with the mean stand-in
    for name, drop in {**drop_h, **drop_n}.items():
        _, module, width = units[name]
        w = _weight(module)  # [C, d_out]
        cols = np.array([i * width + j for i in drop for j in range(width)])
        kept = np.setdiff1d(np.arange(w.shape[0]), cols)
        if not len(kept):
            continue
        xs = x[name]
        y = xs[:, cols] @ w[cols]
        design = np.concatenate([xs[:, kept], np.ones((len(xs), 1))], 1)
        fit = design @ np.linalg.lstsq(design, y, rcond=None)[0]
        assert ((fit - y) ** 2).mean() <= ((y.mean(0) - y) ** 2).mean() * (1 + 1e-9)
    if family in ("llama", "gpt2"):  # headprune's layout keeps the changed columns and the added biases
        path = hp.save_pruned(pruned, tmp_path / family)
        with torch.no_grad():
            again = hp.load_pruned(path)(**probe).logits
        assert float((again - got).abs().max()) <= 1e-6 * scale


@pytest.mark.parametrize("scores", ["fluctuation", "fisher"])
def test_compress_with_linear_stand_ins_meets_the_budget_in_one_statistics_pass(scores, monkeypatch):
    model = build("llama")
    batches = _batches("llama", n=4)
    passes = []
    import headprune.scoring.fluctuation as fl

    real = fl.channel_stats

    def counted(*args, **kwargs):
        passes.append(kwargs.get("gram", False))
        return real(*args, **kwargs)
    monkeypatch.setattr(fl, "channel_stats", counted)
    import headprune.compression.pool as cu
    monkeypatch.setattr(cu, "channel_stats", counted)
    settings = PruneSettings(units="both", share=0.6, price="params", scores=scores, compensate="linear")
    result = compress(model, batches, settings)
    # one forward pass of statistics, second moments included: the fluctuation's own; the Fisher's scoring pass
    # gathers them on its way (no pass of their own)
    assert passes == ([True] if scores == "fluctuation" else [])
    assert result.stages["linear"].startswith("kept")
    # the same units go as with the mean stand-in (whose budget test_fluctuation checks), and as many parameters
    passes.clear()
    held = compress(model, batches, PruneSettings(units="both", share=0.6, price="params", scores=scores,
                                                  compensate="bias"))
    assert passes == ([False] if scores == "fluctuation" else [])  # the bias needs only means
    assert result.dropped_heads == held.dropped_heads and result.dropped_neurons == held.dropped_neurons
    assert any(result.dropped_neurons.values())
    assert result.sizes["after"]["params"] == held.sizes["after"]["params"]
    probe = inputs("llama", batch=2, seed=3)
    with torch.no_grad():
        a, b = result.model(**probe).logits, held.model(**probe).logits
    assert bool(torch.isfinite(a).all()) and float((a - b).abs().max()) > 1e-4 * float(b.abs().max())


def test_linear_settings_are_checked():
    assert PruneSettings(units="both", share=0.5, price="params", compensate="linear").compensate == "linear"
    assert not PruneSettings(units="heads", share=0.5, price="flops", compensate=["linear", "reconstruct"]).head_plan
    with pytest.raises(ConfigError, match="compensate"):
        PruneSettings(units="both", share=0.5, price="params", compensate="affine")
    model = build("llama")
    stats = channel_stats(model, _batches("llama", n=2), gram=False)
    site = hp.find_sites(model)[0].name
    with pytest.raises(PlanError, match="moments"):
        linear_standins(model, stats.mean, {}, {site: [0]}, {})


def test_the_cli_runs_linear_stand_ins_and_the_saved_model_loads_as_another_model_than_the_bias_one(tmp_path):
    from typer.testing import CliRunner

    from headprune.cli import app
    base = cli_fixture(tmp_path)
    runner = CliRunner()
    runs = {}
    for compensate, flags in (("linear", ["--damping", "0.3"]), ("bias", [])):
        out = tmp_path / compensate
        result = runner.invoke(app, [*base, "--compensate", compensate, *flags, "-o", str(out)])
        assert result.exit_code == 0, result.output
        record = json.loads((out / "compress.json").read_text())
        spec = {"name": "linear", "damping": 0.3} if flags else compensate  # a method's settings travel with it
        assert record["settings"]["compensate"] == [spec] and record["stages"][compensate].startswith("kept")
        runs[compensate] = hp.load_pruned(out)
    refused = runner.invoke(app, [*base, "--compensate", "bias", "--damping", "0.3", "-o", str(tmp_path / "x")])
    assert refused.exit_code != 0 and "--damping 0.3 with --compensate bias: no method given has" in refused.output
    assert not (tmp_path / "x").exists()
    probe = inputs("bert", batch=2, seed=5)
    with torch.no_grad():
        got, held = runs["linear"](**probe).logits, runs["bias"](**probe).logits
    assert bool(torch.isfinite(got).all()) and float((got - held).abs().max()) > 1e-4 * float(held.abs().max())


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_the_fisher_pass_gathers_the_statistics_a_forward_of_their_own_gives(family):
    """The channel statistics collected by the Fisher's scoring forwards (masks, labels, gradients on) equal those
    of channel_stats' own no-grad pass over the same batches, padding excluded, second moments included; and
    twice-firing hooks (activation checkpointing recomputes each block in the backward) count once."""
    from headprune.scoring.checkpointing import checkpointed_blocks
    from headprune.scoring.fluctuation import StatsCollector
    from headprune.scoring.units import unit_fisher

    model = build(family)
    batches = _batches(family, n=3)
    real = _real_inputs(model, batches, _units(model))  # plain hooks, numpy: not headprune's collector
    for checkpointed in (False, True):
        collect = StatsCollector(model, gram=True)
        if checkpointed:
            with checkpointed_blocks(model):
                unit_fisher(model, batches, collect=collect)
        else:
            unit_fisher(model, batches, collect=collect)
        got = collect.finish()
        assert set(got.mean) == set(real)
        for k, x in real.items():  # x [N, C]
            assert got.tokens[k] == x.shape[0]
            want = {"mean": x.mean(0), "var": x.var(0), "second": x.T @ x / x.shape[0]}
            for key, b in want.items():
                a = getattr(got, key)[k].numpy()
                assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max() + 1e-12, (family, k, key, checkpointed)
