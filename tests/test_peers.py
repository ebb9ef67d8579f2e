"""benchmarks/peers: each peer's scores against a hand computation written here, FLAP's bias compensation
against the unpruned model with the removed channels replaced by their means, budgets met exactly as
priced; and the harness's quick run (structure, finite and consistent numbers, resume, the docs block)."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import transformers as T

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from peers import flap, llm_pruner, plan, report, wanda_sp  # noqa: E402

import headprune as hp  # noqa: E402
from headprune.compression.replay import apply_plan  # noqa: E402


def llama(layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    config = T.LlamaConfig(hidden_size=48, num_hidden_layers=layers, num_attention_heads=6, num_key_value_heads=2,
                           intermediate_size=37, max_position_embeddings=64, vocab_size=64, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2)
    model = T.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger, uneven weights: scores far apart, so orders are not decided by rounding
        for p in model.parameters():
            p.mul_(1 + 3 * torch.rand_like(p))
    return model


def batches(seed: int = 1, n: int = 2):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(3, 64, (3, 12), generator=g)
        out.append({"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x})
    return out


def captured_inputs(model, data, modules):
    """{name: X [all tokens, C]}: the inputs of ``modules`` over ``data``, concatenated (by hooks, here)."""
    got = {n: [] for n in modules}
    handles = [m.register_forward_hook(lambda _m, a, _o, n=n: got[n].append(a[0].reshape(-1, a[0].shape[-1])))
               for n, m in modules.items()]
    with torch.no_grad():
        for b in data:
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    for h in handles:
        h.remove()
    return {n: torch.cat(v).double() for n, v in got.items()}


def site_modules(model):
    sites, ffns = hp.find_sites(model), hp.find_ffns(model)
    return sites, ffns, {**{s.name: s.o for s in sites}, **{f.name: f.down for f in ffns}}


def test_flap_scores_are_standardised_fluctuation_by_hand():
    model, data = llama(), batches()
    heads, neurons, _ = flap.flap_scores(model, data)
    sites, ffns, modules = site_modules(model)
    x = captured_inputs(model, data, modules)
    for s in sites:
        w = s.o.weight.detach().double()
        per_channel = [(x[s.name][:, j].var(unbiased=False) * (w[:, j] ** 2).sum()) ** 2 for j in range(w.shape[1])]
        v = torch.stack(per_channel)
        z = (v - v.mean()) / v.std()
        want = torch.tensor([z[h * s.head_dim:(h + 1) * s.head_dim].mean() for h in range(s.num_heads)])
        torch.testing.assert_close(heads[s.name], want.double(), rtol=1e-6, atol=1e-9)
    for f in ffns:
        w = f.down.weight.detach().double()
        v = torch.stack([x[f.name][:, j].var(unbiased=False) * (w[:, j] ** 2).sum() for j in range(w.shape[1])])
        torch.testing.assert_close(neurons[f.name], (v - v.mean()) / v.std(), rtol=1e-6, atol=1e-9)


def mean_replaced_logits(model, data, drops: dict[str, list[int]], modules, probe):
    """The unpruned model's logits on ``probe`` with input channels ``drops`` of ``modules`` replaced by their
    means over ``data`` (forward pre-hooks)."""
    x = captured_inputs(model, data, modules)

    def replace(cols, mean):
        def hook(_m, args):
            y = args[0].clone()
            y[..., cols] = mean.to(y.dtype)
            return (y,)
        return hook

    handles = [modules[n].register_forward_pre_hook(replace(torch.tensor(c), x[n].mean(0)[c]))
               for n, c in drops.items() if c]
    with torch.no_grad():
        out = model(input_ids=probe).logits
    for h in handles:
        h.remove()
    return out


def test_flap_bias_equals_removed_channels_replaced_by_their_means():
    model, data = llama(), batches()
    probe = batches(seed=7, n=1)[0]["input_ids"]
    p = flap.flap_plan(model, data, 0.3)
    assert p.dropped_heads and p.dropped_neurons and p.added_biases
    sites, ffns, modules = site_modules(model)
    hd = sites[0].head_dim
    channels = {n: [h * hd + i for h in hs for i in range(hd)] for n, hs in p.dropped_heads.items()} | p.dropped_neurons
    want = mean_replaced_logits(model, data, channels, modules, probe)
    pruned = apply_plan(copy.deepcopy(model), p)
    with torch.no_grad():
        got = pruned(input_ids=probe).logits
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    no_bias = plan.peer_plan(model, "flap", p.dropped_heads, p.dropped_neurons)
    with torch.no_grad():  # the bias matters: without it the pruned model is farther away
        far = apply_plan(copy.deepcopy(model), no_bias)(input_ids=probe).logits
    assert (far - want).abs().max() > 10 * (got - want).abs().max()


def test_bias_survives_a_site_losing_every_head():
    model, data = llama(), batches()
    sites, ffns, modules = site_modules(model)
    s = sites[0]
    drop = list(range(s.num_heads))
    x = captured_inputs(model, data, modules)
    cols = torch.arange(s.num_heads * s.head_dim)
    p = plan.peer_plan(model, "hand", {s.name: drop}, {}, biases={
        "model.layers.0.self_attn.o_proj": flap.compensation(s.o.weight, x[s.name].mean(0), cols)})
    probe = batches(seed=5, n=1)[0]["input_ids"]
    want = mean_replaced_logits(model, data, {s.name: cols.tolist()}, modules, probe)
    pruned = apply_plan(copy.deepcopy(model), p)
    assert s.name not in {t.name for t in hp.find_sites(pruned)}
    with torch.no_grad():
        got = pruned(input_ids=probe).logits
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_wanda_sp_scores_by_hand_layer_by_layer_on_the_pruned_model():
    model, data = llama(), batches()
    p = wanda_sp.wanda_sp_plan(model, data, 0.4)
    ratio = p.info["ratio_per_layer"]
    work = copy.deepcopy(model)
    for layer in range(2):
        sites, ffns, modules = site_modules(work)
        s = next(t for t in sites if t.layer == layer)
        f = next(t for t in ffns if t.layer == layer)
        x = captured_inputs(work, data, modules)
        norm = {n: torch.sqrt((x[n] ** 2).sum(0)) for n in (s.name, f.name)}
        w = s.o.weight.detach().double().abs()
        head = [sum(w[i, c] * norm[s.name][c] for i in range(w.shape[0]) for c in range(h * s.head_dim, (h + 1) * s.head_dim))
                for h in range(s.num_heads)]
        neuron = (f.down.weight.detach().double().abs() * norm[f.name]).sum(0)
        n_heads = int(ratio * s.num_heads)
        assert p.dropped_heads.get(s.name, []) == sorted(torch.argsort(torch.stack(head))[:n_heads].tolist())
        dropped = p.dropped_neurons[f.name]
        assert sorted(torch.argsort(neuron)[:len(dropped)].tolist()) == dropped
        if p.dropped_heads.get(s.name):
            hp.prune_heads(work, {s.name: p.dropped_heads[s.name]})
        hp.prune_neurons(work, {f.name: dropped})


def test_llm_pruner_group_taylor_by_hand():
    model, data = llama(), batches()
    ledger = plan.Ledger(model, 0.5)
    attention, neurons = llm_pruner.group_scores(ledger, llm_pruner.taylor_salience(model, data))
    assert all(p.grad is None for p in model.parameters())
    x = torch.cat([b["input_ids"] for b in data])  # equal-length batches: one mean loss
    model.zero_grad()
    model(input_ids=x, labels=x).loss.backward()
    for s in hp.find_sites(model):
        hd, per_kv = s.head_dim, s.num_heads // s.num_kv_heads
        sal = {k: (m.weight * m.weight.grad).abs().detach().double() for k, m in
               (("q", s.q.module), ("k", s.k.module), ("v", s.v.module), ("o", s.o))}
        for g in range(s.num_kv_heads):
            want = sal["k"][g * hd:(g + 1) * hd].sum() + sal["v"][g * hd:(g + 1) * hd].sum()
            for h in range(g * per_kv, (g + 1) * per_kv):
                want += sal["q"][h * hd:(h + 1) * hd].sum() + sal["o"][:, h * hd:(h + 1) * hd].sum()
            score, members = attention[s.name][g]
            assert members == list(range(g * per_kv, (g + 1) * per_kv))
            assert math.isclose(score, float(want), rel_tol=1e-4)
    for f in hp.find_ffns(model):
        want = sum((u.weight * u.weight.grad).abs().sum(1) for u in f.ups) + (f.down.weight * f.down.weight.grad).abs().sum(0)
        torch.testing.assert_close(neurons[f.name].float(), want.detach(), rtol=1e-4, atol=1e-12)
    model.zero_grad()


def test_llm_pruner_keeps_its_first_and_last_layers_and_drops_the_lowest():
    model, data = llama(layers=6), batches()
    p = llm_pruner.llm_pruner_plan(model, data, 0.2)
    assert p.info["pruned_layers"] == [3, 4]
    layers = {int(n.split(".")[1]) for n in (*p.dropped_heads, *p.dropped_neurons)}
    assert layers <= {3, 4}
    ledger = plan.Ledger(model, 0.2)
    _, neurons = llm_pruner.group_scores(ledger, llm_pruner.taylor_salience(model, data))
    for name, dropped in p.dropped_neurons.items():
        assert dropped == sorted(torch.argsort(neurons[name])[:len(dropped)].tolist())


@pytest.mark.parametrize("budget", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("method", ["flap", "wanda-sp", "llm-pruner"])
def test_budget_met_as_priced(method, budget):
    model, data = llama(layers=8), batches()
    fn = {"flap": flap.flap_plan, "wanda-sp": wanda_sp.wanda_sp_plan, "llm-pruner": llm_pruner.llm_pruner_plan}[method]
    if method == "llm-pruner" and budget == 0.5:
        with pytest.raises(hp.ConfigError, match="too few parameters"):
            fn(model, data, budget)
        return
    p = fn(model, data, budget)
    before = plan.nonembedding_params(model)
    pruned = apply_plan(copy.deepcopy(model), p)
    removed = before - plan.nonembedding_params(pruned)
    assert removed == p.info["planned_removed"]  # the ledger prices units exactly as surgery removes them
    assert removed >= math.ceil(budget * before)
    ledger = plan.Ledger(model, budget)
    site, ffn = next(iter(ledger.sites)), next(iter(ledger.ffns))
    unit = ledger.q_cost(site) + ledger.kv_cost(site)
    bound = unit if method == "flap" else 8 * max(ledger.neuron_cost(ffn), unit)
    assert removed - math.ceil(budget * before) < bound
    out = pruned(input_ids=data[0]["input_ids"]).logits
    assert torch.isfinite(out).all()


def test_ledger_refuses_budgets_outside_zero_one():
    with pytest.raises(hp.ConfigError, match="budget=1.2"):
        plan.Ledger(llama(), 1.2)


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("llm_peers", ROOT / "benchmarks" / "llm_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_rows_are_finite_consistent_and_resume(tmp_path):
    bench = _bench()
    output = tmp_path / "q.json"
    out = bench.main(["--quick", "--budgets", "0.3", "--tp-timeout", "5", "--output", str(output)])
    data = json.loads(output.read_text())
    assert data["rows"] == json.loads(json.dumps(out["rows"]))
    for key in ("model", "calib", "eval", "protocols", "seed"):
        assert key in data["settings"]
    assert {"machine", "versions", "command"} <= set(data)
    assert {(r["method"], r["budget"]) for r in data["rows"]} == {(m, b) for m in bench.METHODS for b in (0.3,)}
    base = data["unpruned"]
    total = base["sizes"]["nonembedding_params"]
    assert set(base["perplexity"]) == {"window128", "window2048", "block256"}
    for k, v in base["perplexity"].items():
        ev = base["evaluation"][k]
        assert math.isclose(v, math.exp(sum(ev["nll_sum"]) / sum(ev["tokens"])), rel_tol=1e-12)
    for r in data["rows"]:
        if r["method"] == "torch-pruning":
            assert r["status"] in ("ok", "failed", "timeout", "unavailable", "not run")
            if r["status"] == "timeout":
                assert r["torch_pruning"]["phase_reached"] and r["torch_pruning"]["stack_at_timeout"]
            continue
        assert r["status"] == "ok", r
        numbers = [*r["perplexity"].values(), *r["ratio"].values(), *sum(r["ratio_ci95"].values(), []),
                   r["prune_seconds"], r["sizes"]["flops_per_token"], *r["decode"]["tokens_per_s"].values()]
        assert all(math.isfinite(x) for x in numbers)
        for k in r["perplexity"]:
            assert math.isclose(r["ratio"][k], r["perplexity"][k] / base["perplexity"][k], rel_tol=1e-9)
            assert r["ratio_ci95"][k][0] <= r["ratio"][k] <= r["ratio_ci95"][k][1]
        removed = total - r["sizes"]["nonembedding_params"]
        assert removed == r["removed_nonembedding_params"]
        if r["method"].startswith("headprune") and r["config"]["compensate"].split("+")[0] in ("bias", "linear", "linear-seq", "obs-seq"):
            # bias and linear stand-ins add output biases (2 x layers x hidden) that the budget does not price
            assert abs(r["removed_minus_target"]) < 0.05 * total, r["method"]
        else:
            assert 0 <= r["removed_minus_target"] < 0.05 * total, r["method"]  # the budget, to within a few units
        assert r["sizes"]["flops_per_token"] < base["sizes"]["flops_per_token"]
        if r["method"] in ("flap", "wanda-sp", "llm-pruner", "slimgpt", "osscar", "sleb", "shortgpt"):
            assert r["removed_nonembedding_params"] == r["info"]["planned_removed"]
        assert r["tool"] == ("headprune" if r["method"].startswith("headprune") else r["method"])
        assert math.isclose(r["removed_share"], removed / total, rel_tol=1e-12)
        assert math.isfinite(r["selection_perplexity"]) and r["selection_perplexity"] > 1
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    assert len(data["results"]) == sum(len(r["perplexity"]) for r in ok)
    for e in data["results"]:
        assert {"tool", "method", "removed_share", "window", "perplexity"} <= set(e)
    mine = [r for r in ok if r["tool"] == "headprune"]
    chosen = min(mine, key=lambda r: r["selection_perplexity"])
    assert data["selected"] == {"0.3": chosen["method"]}
    peers = [r for r in ok if r["tool"] != "headprune"]
    for window, v in data["verdicts"]["0.3"].items():
        assert v["lower_than_every_peer"] == all(chosen["perplexity"][window] < r["perplexity"][window] for r in peers)
        best_peer = min(peers, key=lambda r: r["perplexity"][window])
        assert v["best_peer"] == best_peer["method"]
        assert v["interval_below_best_peer"] == (chosen["ratio_ci95"][window][1] < best_peer["ratio"][window])
        direct = math.exp((sum(chosen["nll_sum"][window]) - sum(best_peer["nll_sum"][window]))
                          / sum(base["evaluation"][window]["tokens"]))
        assert math.isclose(v["ratio_to_best_peer"], direct, rel_tol=1e-9)
        assert math.isclose(direct, chosen["perplexity"][window] / best_peer["perplexity"][window], rel_tol=1e-9)
        assert v["ratio_to_best_peer_ci95"][0] <= direct <= v["ratio_to_best_peer_ci95"][1]
        lo, hi = v["ratio_to_best_peer_ci_simultaneous"]
        assert lo <= direct <= hi and v["simultaneous_over"] == len(data["verdicts"]["0.3"])
        # the Bonferroni level (1 - 0.05 / 3 here) lies between the same bootstrap's 99.9% and 50% intervals
        tokens = base["evaluation"][window]["tokens"]
        pair = ({"nll_sum": best_peer["nll_sum"][window], "tokens": tokens},
                {"nll_sum": chosen["nll_sum"][window], "tokens": tokens})
        wide = bench.protocol.ratio_interval(*pair, resamples=10_000, level=0.999)
        narrow = bench.protocol.ratio_interval(*pair, resamples=10_000, level=0.5)
        assert wide[1] <= lo <= narrow[1] <= narrow[2] <= hi <= wide[2]  # same draws: the levels nest
    flap_row = next(r for r in peers if r["method"] == "flap")
    timed = data["prune_time"]["0.3"]
    assert timed["headprune"] == chosen["method"]
    assert math.isclose(timed["ratio_to_flap"], chosen["prune_seconds"] / flap_row["prune_seconds"], rel_tol=1e-12)
    again = bench.main(["--quick", "--budgets", "0.3", "--tp-timeout", "5", "--output", str(output)])
    assert again["rows"] == out["rows"]  # resumed: nothing recomputed
    # a changed configuration reruns its own rows only
    changed = next(iter(bench.CONFIGURATIONS))
    monkey = dict(bench.CONFIGURATIONS[changed], compensate="none" if bench.CONFIGURATIONS[changed]["compensate"] != "none"
                  else "bias")
    original = bench.CONFIGURATIONS[changed]
    bench.CONFIGURATIONS[changed] = monkey
    try:
        third = bench.main(["--quick", "--budgets", "0.3", "--tp-timeout", "5", "--output", str(output)])
    finally:
        bench.CONFIGURATIONS[changed] = original
    kept = {r["method"]: r for r in third["rows"]}
    assert kept[changed]["config"] == monkey
    assert all(kept[r["method"]] == r for r in out["rows"] if r["method"] != changed)
    page = tmp_path / "peers.md"
    page.write_text((ROOT / "docs" / "peers.md").read_text())
    report.write_docs(page, data)
    text = page.read_text()
    assert (tmp_path / report.FIGURE).stat().st_size > 0
    for r in data["rows"]:
        if r["status"] == "ok":
            assert f"{r['ratio']['window128']:.3f}" in text


@pytest.mark.parametrize("flags, named", [(["--methods", "flap,sparsegpt"], "--methods"),
                                          (["--budgets", "0.2,1.5"], "--budgets"),
                                          (["--windows", "1"], "--windows")])
def test_bad_selections_exit_with_one_line_naming_the_flag(flags, named, tmp_path):
    with pytest.raises(SystemExit, match=named) as err:
        _bench().main(["--quick", *flags, "--output", str(tmp_path / "q.json")])
    assert "\n" not in str(err.value)
    assert not (tmp_path / "q.json").exists()


def test_docs_block_without_results_is_a_note(tmp_path):
    page = tmp_path / "peers.md"
    page.write_text((ROOT / "docs" / "peers.md").read_text())
    report.write_docs(page, None)
    text = page.read_text()
    assert "No committed run yet" in text and "## The protocol" in text
    assert not (tmp_path / report.FIGURE).exists()


def test_linear_damping_sweep_on_held_out_calibration_and_a_huge_damping_is_the_bias(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("linear_damping", ROOT / "benchmarks" / "linear_damping.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    out = sweep.main(["--quick", "--threads", "1", "--dampings", "0.3,1e12", "--output", str(tmp_path / "d.json")])
    assert json.loads((tmp_path / "d.json").read_text())["rows"] == json.loads(json.dumps(out["rows"]))
    bias, linear, huge = out["rows"]
    assert (bias["compensate"], linear["damping"], huge["damping"]) == ("bias", 0.3, 1e12)
    assert all(math.isfinite(r["held_out_perplexity"]) for r in out["rows"])
    # a ridge that large leaves the mean stand-in: the same model as FLAP's bias, so the same perplexity
    assert huge["held_out_perplexity"] == pytest.approx(bias["held_out_perplexity"], rel=1e-5)
    assert linear["held_out_perplexity"] != pytest.approx(bias["held_out_perplexity"], rel=1e-5)
    assert out["best_damping"] in (0.3, 1e12)
    assert not any(k.startswith("eval") for k in out["settings"])  # the comparison's evaluation text is not named


@pytest.mark.parametrize("script", ["llm_peers", "encoder_peers"])
def test_the_committed_docs_block_is_what_the_committed_results_generate(script, tmp_path):
    """docs/peers.md quotes every peer figure from the committed JSON: regenerating its block changes nothing."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(script, ROOT / "benchmarks" / f"{script}.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    committed = (ROOT / "docs" / "peers.md").read_text()
    page = tmp_path / "peers.md"
    page.write_text(committed)
    bench.main(["--write-docs", str(page)])
    assert page.read_text() == committed, f"run: python benchmarks/{script}.py --write-docs docs/peers.md"
