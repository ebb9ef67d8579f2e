"""One budget over heads and neurons: prices add up to what the FLOP counter measures on the pruned model,
the search matches brute force where it claims to be exact, the refit matches a direct least-squares
solve, and compress keeps its budget and says which stages it kept."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

import headprune as hp
from headprune.compression import PruneSettings, Reconstruct, compress
from headprune.compression.reconstruct import reconstruct
from headprune.core.masks.masking import masked_neurons, neuron_mask_from
from headprune.core.model.cost import flop_breakdown
from headprune.core.model.ffn import find_ffns
from headprune.core.model.unit_cost import UnitCosts, unit_costs
from headprune.core.prune import prune_neurons
from headprune.errors import ConfigError
from headprune.selection.budgets import Budget, HeadRule
from headprune.selection.units import select_units
from tiny import build, inputs, labels


def _batches(family, n=4, batch=6):
    out = []
    for s in range(n):
        x = inputs(family, batch=batch, seed=s)
        out.append({**x, "labels": labels(family, x, seed=s)})
    return out


@pytest.mark.parametrize("family", ["bert", "gpt2", "bart", "t5"])
def test_flop_prices_add_up_to_the_counter_on_the_pruned_model(family):
    model = build(family)
    costs = unit_costs(model, "flops", seq_len=12, tgt_len=6)
    heads = {s.name: [0, 2] for s in hp.find_sites(model)}
    neurons = {f.name: list(range(0, f.width, 3)) for f in find_ffns(model)}
    before = flop_breakdown(model, 12, tgt_len=6)["total"]
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, heads, verify=False)
    prune_neurons(pruned, neurons)
    after = flop_breakdown(pruned, 12, tgt_len=6)["total"]
    priced = sum(float(costs.heads[k][v].sum()) for k, v in heads.items()) + \
        sum(float(costs.neurons[k][v].sum()) for k, v in neurons.items())
    assert abs((before - after) - priced) <= 1e-9 * before


def test_param_prices_of_neurons_add_up_to_the_parameter_count():
    model = build("llama")
    costs = unit_costs(model, "params")
    neurons = {f.name: [1, 4, 5] for f in find_ffns(model)}
    before = sum(p.numel() for p in model.parameters())
    prune_neurons(model, neurons)
    assert before - sum(p.numel() for p in model.parameters()) == \
        sum(float(costs.neurons[k][v].sum()) for k, v in neurons.items())


def test_search_is_exact_for_one_price_per_kind_against_brute_force():
    g = torch.Generator().manual_seed(0)
    hs = {"encoder.0.self": torch.rand(3, generator=g, dtype=torch.float64), "encoder.1.self": torch.rand(2, generator=g, dtype=torch.float64)}
    ns = {"encoder.0.ffn": torch.rand(4, generator=g, dtype=torch.float64), "encoder.1.ffn": torch.rand(3, generator=g, dtype=torch.float64)}
    costs = UnitCosts({k: torch.full_like(v, 5.0, dtype=torch.float64) for k, v in hs.items()},
                      {k: torch.full_like(v, 2.0, dtype=torch.float64) for k, v in ns.items()}, "flops")
    units = [("h", k, i, float(v[i]), 5.0) for k, v in hs.items() for i in range(v.numel())] + \
            [("n", k, i, float(v[i]), 2.0) for k, v in ns.items() for i in range(v.numel())]
    total = sum(u[4] for u in units)
    for share in (0.2, 0.45, 0.7):
        best = max(sum(u[3] for u in keep) for r in range(len(units) + 1)
                   for keep in itertools.combinations(units, r) if sum(u[4] for u in keep) <= share * total)
        dh, dn, summary = select_units(hs, ns, costs, Budget.of(share=share))
        kept = sum(float(v.sum()) for v in hs.values()) + sum(float(v.sum()) for v in ns.values()) - \
            sum(float(hs[k][v].sum()) for k, v in dh.items()) - sum(float(ns[k][v].sum()) for k, v in dn.items())
        assert abs(kept - best) <= 1e-9 and summary["price_kept"] <= share * total + 1e-9


def test_units_pool_leaves_the_other_kind_alone_and_bad_settings_are_refused():
    hs = {"a": torch.tensor([1.0, 2.0])}
    ns = {"f": torch.tensor([3.0, 1.0, 2.0])}
    costs = UnitCosts({"a": torch.tensor([1.0, 1.0])}, {"f": torch.tensor([1.0, 1.0, 1.0])}, "flops")
    dh, dn, _ = select_units(hs, ns, costs, Budget.of(share=1 / 3), units="neurons")
    assert dh == {} and dn == {"f": [1, 2]}
    with pytest.raises(ConfigError, match="units"):
        select_units(hs, ns, costs, Budget.of(share=0.5), units="layers")
    with pytest.raises(ConfigError, match="share"):
        PruneSettings(units="both", share=1.5)


def test_refit_of_the_first_projection_equals_a_direct_least_squares_solve():
    teacher = build("bert")
    student = copy.deepcopy(teacher)
    prune_neurons(student, {"encoder.0.ffn": list(range(0, 37, 2))})
    batches = _batches("bert", n=3)
    # the reference: the kept neurons' activations and the unpruned FFN output, read with plain hooks
    xs, ys = [], []
    f_s, f_t = find_ffns(student)[0], find_ffns(teacher)[0]
    h1 = f_s.down.register_forward_pre_hook(lambda m, a: xs.append(a[0].detach()))
    h2 = f_t.down.register_forward_hook(lambda m, a, y: ys.append(y.detach()))
    with torch.no_grad():
        for b in batches:
            student(**{k: v for k, v in b.items() if k != "labels"})
            teacher(**{k: v for k, v in b.items() if k != "labels"})
    h1.remove()
    h2.remove()
    real = torch.cat([b["attention_mask"].flatten().bool() for b in batches])
    x = torch.cat([t.reshape(-1, t.shape[-1]) for t in xs])[real].double()
    y = torch.cat([t.reshape(-1, t.shape[-1]) for t in ys])[real].double()
    a = torch.cat([x, torch.ones(x.shape[0], 1, dtype=torch.float64)], 1)
    want = torch.linalg.lstsq(a, y).solution  # [k + 1, d]
    rows = reconstruct(student, teacher, batches, damping=0.0, target="output")
    got = torch.cat([f_s.down.weight.detach().double().T, f_s.down.bias.detach().double()[None]], 0)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert all(r["error_after"] <= r["error_before"] * (1 + 1e-9) + 1e-9 for r in rows)


@pytest.mark.parametrize("family", ["bert", "t5", "llama", "gpt2"])
def test_compress_both_keeps_the_budget_and_equals_the_masked_model_without_compensation(family):
    model = build(family)
    batches = _batches(family)
    result = compress(model, batches, PruneSettings(units="both", share=0.5, seq_len=12, tgt_len=6, compensate="none"))
    costs = unit_costs(model, "flops", seq_len=12, tgt_len=6)
    spent = costs.total() - sum(float(costs.heads[k][v].sum()) for k, v in result.dropped_heads.items()) - \
        sum(float(costs.neurons[k][v].sum()) for k, v in result.dropped_neurons.items())
    assert spent <= 0.5 * costs.total() * (1 + 1e-9)
    x = inputs(family)
    with hp.masked(model, hp.mask_from_heads(model, result.dropped_heads)), \
            masked_neurons(model, neuron_mask_from(model, result.dropped_neurons)), torch.no_grad():
        want = model(**x).logits
    with torch.no_grad():
        got = result.model(**x).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert result.stages["reconstruct"] == "skipped" and "stages: select kept" in result.summary()


def test_held_out_batches_are_spread_over_the_order():
    from headprune.compression.pool import held_out

    assert held_out(4, 1) == {2} and held_out(8, 2) == {2, 6} and held_out(3, 2) == {0, 2}
    assert all(len(held_out(n, k)) == k for n in range(2, 40) for k in range(1, n))


def test_reconstruction_is_judged_on_held_out_batches_and_the_choice_follows_the_validation_loss():
    model = build("bert")
    batches = _batches("bert", n=4)
    result = compress(model, batches, PruneSettings(units="both", share=0.4, seq_len=12))
    assert result.split == {"calib_batches": 3, "val_batches": 1, "calib_examples": 18, "val_examples": 6,
                            "fit_batches": 3, "fit_examples": 18}
    v = result.losses
    kept = v["reconstructed"] <= v["pruned"]
    assert result.stages["reconstruct"].startswith("kept" if kept else "rejected")
    loss = hp.scoring.gradients.mean_loss(result.model, batches[2:3])  # the held-out batch: spread, not the last
    assert abs(loss - (v["reconstructed"] if kept else v["pruned"])) <= 1e-6 * abs(loss)


def test_the_refit_reads_the_fit_batches_and_needs_separate_validation():
    model = build("bert")
    batches = _batches("bert", n=6)
    calib, fit, val = batches[:2], batches[:5], batches[5:]
    result = compress(model, calib, PruneSettings(units="both", share=0.4, seq_len=12,
                                                  compensate=Reconstruct(target="output")),
                      val_batches=val, fit_batches=fit)
    assert result.split["fit_examples"] == 30 and result.split["calib_examples"] == 12
    # the reference: the unpruned first output projection's squared outputs over the fit batches' real tokens
    first = hp.find_sites(model)[0]
    outs = []
    handle = first.o.register_forward_hook(lambda m, a, y: outs.append(y.detach()))
    with torch.no_grad():
        for b in fit:
            model(**{k: v for k, v in b.items() if k != "labels"})
    handle.remove()
    real = torch.cat([b["attention_mask"].flatten().bool() for b in fit])
    want = float(torch.cat([y.reshape(-1, y.shape[-1]) for y in outs])[real].double().pow(2).sum())
    row = next(r for r in result.reconstruction if r["layer"] == first.name)
    assert row["target_norm"] == pytest.approx(want, rel=1e-5)
    with pytest.raises(ConfigError, match="fit_batches without val_batches"):
        compress(model, calib, PruneSettings(units="both", share=0.4, seq_len=12), fit_batches=fit)
    with pytest.raises(ConfigError, match="fit_batches: empty"):
        compress(model, calib, PruneSettings(units="both", share=0.4, seq_len=12), fit_batches=[],
                 val_batches=val)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_cached_and_recomputed_targets_give_the_same_refit(family):
    teacher = build(family)
    student = copy.deepcopy(teacher)
    hp.prune_heads(student, {hp.find_sites(student)[0].name: [1]}, verify=False)
    prune_neurons(student, {f.name: [0, 3, 8] for f in find_ffns(student)})
    other = copy.deepcopy(student)
    batches = _batches(family, n=2)
    a = reconstruct(student, teacher, batches)
    b = reconstruct(other, teacher, batches, cache_mb=0)
    assert [r["target"] for r in a] == [r["target"] for r in b] and "residual" in {r["target"] for r in a}
    for p, q in zip(student.parameters(), other.parameters(), strict=True):
        assert (p - q).abs().max() <= 1e-6 * max(q.abs().max(), 1e-12)


def test_latency_prices_are_the_measured_slopes_and_a_noisy_table_is_refused():
    from headprune.bench.unit_latency import latency_prices, latency_table

    model = build("bert")

    def by_flops(models):  # a machine whose time is exactly the FLOPs: the prices must be the FLOP slopes
        return {k: 1e-9 * flop_breakdown(m, 12)["total"] for k, m in models.items()}

    table = latency_table(model, seq_len=12, timer=by_flops)
    assert table["removed"] == {"neurons": 2 * 18, "heads": 2 * 2}
    prices = latency_prices(model, table)
    flops = unit_costs(model, "flops", seq_len=12)
    assert float(prices.neurons["encoder.0.ffn"][0]) == pytest.approx(1e-9 * float(flops.neurons["encoder.0.ffn"][0]))
    assert float(prices.heads["encoder.1.self"][3]) == pytest.approx(1e-9 * float(flops.heads["encoder.1.self"][3]))
    table["seconds"]["heads_half"] = table["seconds"]["full"] * 1.01
    with pytest.raises(ConfigError, match="did not make the model faster"):
        latency_prices(model, table)


def test_min_per_site_equals_brute_force_over_plans_keeping_a_head_everywhere():
    g = torch.Generator().manual_seed(3)
    hs = {"encoder.0.self": torch.rand(3, generator=g, dtype=torch.float64) * 0.01,  # a site worth emptying
          "encoder.1.self": torch.rand(2, generator=g, dtype=torch.float64)}
    ns = {"encoder.0.ffn": torch.rand(4, generator=g, dtype=torch.float64), "encoder.1.ffn": torch.rand(3, generator=g, dtype=torch.float64)}
    costs = UnitCosts({k: torch.full_like(v, 5.0) for k, v in hs.items()},
                      {k: torch.full_like(v, 2.0) for k, v in ns.items()}, "flops")
    units = [("h", k, i, float(v[i]), 5.0) for k, v in hs.items() for i in range(v.numel())] + \
            [("n", k, i, float(v[i]), 2.0) for k, v in ns.items() for i in range(v.numel())]
    total = sum(u[4] for u in units)
    emptied_without = False
    for share in (0.35, 0.5, 0.7):
        best = max(sum(u[3] for u in keep) for r in range(len(units) + 1)
                   for keep in itertools.combinations(units, r) if sum(u[4] for u in keep) <= share * total
                   and all(any(u[0] == "h" and u[1] == site for u in keep) for site in hs))
        dh, dn, summary = select_units(hs, ns, costs, Budget.of(share=share), rule=HeadRule(min_per_site=1))
        kept = sum(float(v.sum()) for v in hs.values()) + sum(float(v.sum()) for v in ns.values()) - \
            sum(float(hs[k][v].sum()) for k, v in dh.items()) - sum(float(ns[k][v].sum()) for k, v in dn.items())
        assert abs(kept - best) <= 1e-9 and summary["price_kept"] <= share * total + 1e-9
        assert all(len(dh.get(site, [])) < hs[site].numel() for site in hs)
        plain, _, _ = select_units(hs, ns, costs, Budget.of(share=share))
        emptied_without |= any(len(plain.get(site, [])) == hs[site].numel() for site in hs)
    assert emptied_without  # the constraint was binding somewhere
    with pytest.raises(ConfigError, match="min_per_site=2"):  # two heads per site cost 20 of 59
        select_units(hs, ns, costs, Budget.of(share=0.3), rule=HeadRule(min_per_site=2))


def test_min_per_site_on_grouped_query_attention_keeps_whole_steps_and_the_pool_path_accepts_it():
    from headprune.selection.gqa import kv_groups

    model = build("llama")
    groups = kv_groups(model)
    costs = unit_costs(model, "params")
    gen = torch.Generator().manual_seed(0)
    heads = {s: torch.rand(len(gr), generator=gen, dtype=torch.float64) for s, gr in groups.items()}
    first = next(iter(heads))
    heads[first] = heads[first] * 1e-6  # without the floor, this site goes first
    neurons = {k: torch.rand(v.numel(), generator=gen, dtype=torch.float64) for k, v in costs.neurons.items()}
    n_kv = {s: len(set(gr)) for s, gr in groups.items()}
    dh, _, summary = select_units(heads, neurons, costs, Budget.of(share=0.3), groups=groups,
                                  rule=HeadRule(min_per_site=1))
    for site, gr in groups.items():
        left = len(gr) - len(dh.get(site, []))
        assert left >= n_kv[site] and left % n_kv[site] == 0  # whole steps: one head of every group at least
    plain, _, _ = select_units(heads, neurons, costs, Budget.of(share=0.3), groups=groups)
    assert len(plain.get(first, [])) == len(groups[first])  # the floor was binding
    assert summary["kept"]["heads"] == sum(len(gr) - len(dh.get(s, [])) for s, gr in groups.items())
    settings = hp.PruneSettings(units="both", price="params", share=0.3, scores="fluctuation", compensate="bias",
                                min_per_site=1)
    result = hp.compress(model, _batches("llama"), settings)
    for site in hp.find_sites(result.model):
        assert site.num_heads >= 1
