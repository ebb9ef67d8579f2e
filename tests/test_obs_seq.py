"""``compensate="obs-seq"``: the units within each site / FFN re-chosen greedily by their OBS error on the pruned
model's inputs, then linear-seq's stand-ins. The greedy choice is checked against a brute-force greedy that solves
each candidate's refit directly with numpy (no OBS formula, no downdate); the whole model against
test_linear_seq's numpy reference applied to the units obs-seq chose."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headprune as hp
from headprune.compression import PruneSettings, compress
from headprune.core.cut.obs import greedy_removal
from headprune.errors import ConfigError
from test_linear_seq import SETTINGS, _batches, _linear, _reference
from tiny import build, inputs, labels


def _layer(d_out=6, c=12, tokens=200, seed=0):
    """(W [d_out, C], mean [C], second moment [C, C]) of correlated inputs with a non-zero mean."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(tokens, c)) @ rng.normal(size=(c, c)) * 0.5 + rng.normal(size=c)
    return rng.normal(size=(d_out, c)), x.mean(0), x.T @ x / tokens


def _refit_error(w, mean, second, removed_cols, damping):
    """min over W' (zero on ``removed_cols``) of tr((W - W') H (W - W')^T), H the ridged centred covariance:
    the normal equations solved directly."""
    h = second - np.outer(mean, mean)
    h = h + damping * np.clip(np.diag(h), 0, None).mean() * np.eye(len(h))
    kept = [i for i in range(len(h)) if i not in set(removed_cols)]
    w_hk = w @ h[:, kept]  # [d_out, k]; the optimum W'_K = W H_:K H_KK^-1
    return float(np.trace(w @ h @ w.T) - np.trace(w_hk @ np.linalg.solve(h[np.ix_(kept, kept)], w_hk.T)))


def _brute_greedy(w, mean, second, pools, width, damping):
    """Each step: every candidate of every pool with units left, its removal's refit error solved directly; the least."""
    left = [(list(units), count) for units, count in pools]
    removed: list[int] = []
    while any(count for _, count in left):
        best = None
        for i, (units, count) in enumerate(left):
            for u in units if count else ():
                cols = [v * width + j for v in removed + [u] for j in range(width)]
                err = _refit_error(w, mean, second, cols, damping)
                if best is None or err < best[0]:
                    best = (err, i, u)
        _, i, u = best
        left[i] = ([v for v in left[i][0] if v != u], left[i][1] - 1)
        removed.append(u)
    return sorted(removed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_neurons_match_a_brute_force_greedy(seed):
    w, mean, second = _layer(seed=seed)
    got = greedy_removal(torch.from_numpy(w), torch.from_numpy(mean), torch.from_numpy(second), [(range(12), 5)], 1, 0.01)
    assert got == _brute_greedy(w, mean, second, [(range(12), 5)], 1, 0.01)


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_heads_in_pools_match_a_brute_force_greedy(seed):
    """Units of 3 columns (4 heads), two pools (key/value groups) each losing its own count."""
    w, mean, second = _layer(seed=seed)
    pools = [([0, 1], 1), ([2, 3], 1)]
    got = greedy_removal(torch.from_numpy(w), torch.from_numpy(mean), torch.from_numpy(second), pools, 3, 0.05)
    assert got == _brute_greedy(w, mean, second, pools, 3, 0.05)
    assert sum(u in (0, 1) for u in got) == 1  # each pool's count kept


def test_greedy_removes_a_feature_the_others_predict():
    """Feature 7 is 2x feature 3 plus 1: removing either costs nothing once the kept columns are refit, any other
    feature costs its weight's share of the output."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 10)) * np.arange(1, 11)
    x[:, 7] = 2 * x[:, 3] + 1
    w = rng.normal(size=(5, 10)) * 10
    got = greedy_removal(torch.from_numpy(w), torch.from_numpy(x.mean(0)), torch.from_numpy(x.T @ x / 300),
                         [(range(10), 1)], 1, 1e-8)
    assert got in ([3], [7])


def test_obs_seq_keeps_the_counts_and_equals_linear_seq_on_the_units_it_chose():
    torch.manual_seed(0)
    model = build("llama")
    batches = _batches("llama")
    obs = compress(model, batches, PruneSettings(**SETTINGS, compensate=[_linear("obs-seq")]))
    seq = compress(model, batches, PruneSettings(**SETTINGS, compensate=[_linear("linear-seq")]))
    assert obs.stages["obs-seq"].startswith("kept")
    kv = {s.name: hp.core.model.sites.kv_of_heads(s) for s in hp.find_sites(model)}
    for name, heads in seq.dropped_heads.items():  # as many query heads per key/value group
        assert sorted(kv[name][h] for h in obs.dropped_heads.get(name, [])) == sorted(kv[name][h] for h in heads)
    assert {k: len(v) for k, v in obs.dropped_neurons.items()} == {k: len(v) for k, v in seq.dropped_neurons.items()}
    assert obs.dropped_neurons != seq.dropped_neurons  # re-chosen: a real check of the reference below
    assert obs.plan.dropped_neurons == obs.dropped_neurons
    ref = _reference(model, batches, obs.dropped_heads, obs.dropped_neurons)
    probe = inputs("llama", batch=3, seed=9, pad=False)
    with torch.no_grad():
        got, want = obs.model(**probe).logits, ref(**probe).logits
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


def test_obs_seq_is_refused_where_blocks_cannot_be_replayed():
    model = build("bart")
    x = inputs("bart", batch=5, seed=0)
    with pytest.raises(ConfigError, match="obs-seq.*allowed: compensate='linear'"):
        compress(model, [{**x, "labels": labels("bart", x, seed=0)}], PruneSettings(**SETTINGS, compensate="obs-seq"))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_narrowed_block_hands_on_what_the_zeroed_block_hands_on(family):
    """The block-by-block pass runs each folded block with its removed units cut out of the projections writing and
    reading them: its outputs equal the zeroed block's (a hand-zeroed copy of the weights, run whole) up to the
    rounding of shorter sums, and the model is left as it was."""
    from headprune.compression.blockwise import _narrowed, _zero_removed
    from headprune.core.model.ffn import in_features, out_features
    from headprune.core.model.sites import find_sites

    torch.manual_seed(3)
    model = build(family).eval()
    site, ffn = hp.find_sites(model)[0], hp.find_ffns(model)[0]
    heads, neurons = {site.name: [0]}, {ffn.name: [1, 4, 5]}
    _zero_removed(model, heads, neurons)
    width, heads_before = ffn.width, site.num_heads
    probe = inputs(family, batch=2, seed=4, pad=False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        want = model(**probe).logits
        with _narrowed(model, heads, neurons):
            assert out_features(ffn.ups[0]) == width - 3 and find_sites(model)[0].num_heads == heads_before - 1
            assert in_features(ffn.down) == width - 3
            got = model(**probe).logits
        again = model(**probe).logits
    assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())
    assert torch.equal(again, want)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())



@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gpt2"])
def test_replayed_attention_gives_what_running_it_gives(monkeypatch, family):
    """The pass handing each block's outputs on replays its attention sites from what the moment pass saw (their
    output projections' inputs, through the folded projection): the same units and weights as running them."""
    from headprune.compression import blockwise

    torch.manual_seed(0)
    model, batches = build(family), _batches(family)
    calls = []
    real = blockwise._AttentionReplay._forward

    def counted(self, site):
        forward = real(self, site)
        return lambda *a, **k: (calls.append(site.name), forward(*a, **k))[1]

    monkeypatch.setattr(blockwise._AttentionReplay, "_forward", counted)
    got = compress(model, batches, PruneSettings(**SETTINGS, compensate="obs-seq"))
    assert calls  # the sites were replayed, not run
    monkeypatch.setattr(blockwise._AttentionReplay, "hooks", lambda self: [])  # nothing seen: every site runs
    ran = compress(model, batches, PruneSettings(**SETTINGS, compensate="obs-seq"))
    assert got.dropped_heads == ran.dropped_heads and got.dropped_neurons == ran.dropped_neurons
    probe = inputs(family, batch=3, seed=9, pad=False)
    with torch.no_grad():
        a, b = got.model(**probe).logits, ran.model(**probe).logits
    assert float((a - b).abs().max()) <= 1e-6 * float(b.abs().max())


def test_replay_gives_back_a_forward_set_on_the_attention_instance():
    """A forward set on the module instance (as a dispatch hook's wrapper is) is the one there after the replay."""
    from headprune.compression.blockwise import _AttentionReplay

    model = build("llama")
    site = hp.find_sites(model)[0]
    wrapper = site.attention.forward  # a bound method, set on the instance
    site.attention.forward = wrapper
    replay = _AttentionReplay([site])
    replay.inputs[site.name].append(torch.zeros(1, 2, site.num_heads * site.head_dim))
    replay.rest[site.name].append((None,))
    with replay.replaying(1) as live:
        assert live == {site.name} and site.attention.forward is not wrapper
    assert site.attention.__dict__["forward"] is wrapper
    plain = hp.find_sites(model)[1]
    with _AttentionReplay([plain]).replaying(0):
        pass
    assert "forward" not in plain.attention.__dict__
