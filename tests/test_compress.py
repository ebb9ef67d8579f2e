"""Compression beyond the paper (Kwon et al. 2022 on heads): Fisher, budgets, rearrangement, tuning, folding."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.compression import PruneSettings, compress, plan_heads
from headprune.compression.tuning import residual_norms, scale_mask, tune_scales
from headprune.core.masks.folding import fold_scales
from headprune.core.model.cost import flop_breakdown, head_costs
from headprune.errors import ConfigError, KVCacheWarning
from headprune.scoring.fisher import fisher_information, quadratic
from headprune.scoring.gradients import per_example_loss
from headprune.selection.budget import budget_heads
from headprune.selection.budgets import Budget
from headprune.selection.rearrange import rearrange, rearrange_site
from tiny import build, inputs, labels, word_tokenizer

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from more threads, and a busy machine makes their sync very slow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _batches(family, seeds=(1, 2), batch=4):
    out = []
    for s in seeds:
        x = inputs(family, batch=batch, seed=s)
        x["labels"] = labels(family, x)
        out.append(x)
    return out


# ---------------------------------------------------------------- Fisher

@pytest.mark.parametrize("family", ["bert", "llama", "bart"])
def test_fisher_is_sum_of_squared_per_example_gradients(family):
    model = build(family)
    batches = _batches(family)
    fisher = fisher_information(model, batches)
    sites = hp.find_sites(model)
    diag = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in sites}
    outer = {s.name: torch.zeros(s.num_heads, s.num_heads, dtype=torch.float64) for s in sites}
    n = 0
    for batch in batches:  # one forward + backward per example, a [H] mask per site
        for i in range(batch["input_ids"].shape[0]):
            one = {k: v[i:i + 1] for k, v in batch.items()}
            xi = hp.ones_mask(model, requires_grad=True)
            with hp.masked(model, xi):
                out = model(**{k: v for k, v in one.items() if k != "labels" or model.config.is_encoder_decoder})
                loss, valid = per_example_loss(model, one, out)
            if not bool(valid.all()):
                continue
            loss.sum().backward()
            n += 1
            for s in sites:
                g = xi[s.name].grad.double()
                diag[s.name] += g * g
                outer[s.name] += torch.outer(g, g)
    assert fisher.n == n
    for name in diag:
        assert torch.allclose(fisher.diag[name], diag[name], rtol=1e-4, atol=1e-10), name
        assert torch.allclose(fisher.blocks[name], outer[name], rtol=1e-4, atol=1e-10), name
        assert torch.equal(fisher.blocks[name].diagonal(), fisher.diag[name])


# ---------------------------------------------------------------- budgets

@pytest.mark.parametrize("family, drop", [
    ("bart", {"encoder.0.self": [1, 2], "decoder.1.cross": [0, 1, 2, 3]}),
    ("llama", {"decoder.0.self": [0, 1, 2], "decoder.1.self": [0, 3, 4]}),  # GQA: a key/value head goes, one stays
])
def test_head_prices_add_up_to_the_attention_flops_of_the_pruned_model(family, drop):
    model = build(family)
    costs = head_costs(model, 12, tgt_len=6)
    before = flop_breakdown(model, 12, tgt_len=6)
    assert costs.total() == before["projections"] + before["attention"]
    assert sum(float(c.sum()) for c in costs.per_head().values()) == pytest.approx(costs.total())
    if family == "bart":
        assert costs.head["decoder.0.cross"][0] != costs.head["decoder.0.self"][0]  # priced at their own lengths
    kept = {s.name: [h for h in range(s.num_heads) if h not in drop.get(s.name, [])] for s in hp.find_sites(model)}
    hp.prune_heads(model, drop)
    after = flop_breakdown(model, 12, tgt_len=6)
    assert after["projections"] + after["attention"] == costs.cost(kept)
    assert after["other"] == before["other"]


def test_selection_honours_head_and_flop_budgets_exactly():
    g = torch.Generator().manual_seed(0)
    scores = {f"encoder.{i}.self": torch.rand(4, generator=g) for i in range(3)}
    scores["decoder.0.cross"] = torch.rand(4, generator=g)
    costs = {k: torch.full((4,), 3.0 if "cross" in k else 1.0) for k in scores}
    total_heads, total_cost = 16, sum(float(c.sum()) for c in costs.values())
    for keep in (0.0, 0.25, 0.5, 0.75, 1.0):
        drop = budget_heads(scores, Budget.of(keep=keep))
        assert total_heads - sum(map(len, drop.values())) == round(keep * total_heads)
    for n_keep in (5, 9):
        drop = budget_heads(scores, Budget.of(n_keep=n_keep), min_per_site=1)
        assert total_heads - sum(map(len, drop.values())) == n_keep
        assert all(len(drop.get(k, [])) <= 3 for k in scores)  # one head left in every site
    for share, least in ((0.1, 0), (0.3, 1), (0.5, 1), (0.9, 2)):
        drop = budget_heads(scores, Budget.of(flops=share), costs, min_per_site=least)
        kept_cost = sum(float(c.sum()) - sum(float(c[h]) for h in drop.get(k, [])) for k, c in costs.items())
        assert kept_cost <= share * total_cost + 1e-9
        for k, heads in drop.items():  # maximal: no dropped head would still fit
            assert all(kept_cost + float(costs[k][h]) > share * total_cost for h in heads)
            assert len(heads) <= 4 - least
    cheap = budget_heads({"a": torch.tensor([1.0, 0.9]), "b": torch.tensor([1.5])}, Budget.of(flops=0.5),
                         {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([2.0])})
    assert cheap == {"b": [0]}  # score per FLOP: the two cheap heads beat the better, dearer one
    with pytest.raises(ConfigError, match="n_keep=2 keeps 2 heads, below"):
        budget_heads(scores, Budget.of(n_keep=2), min_per_site=1)
    with pytest.raises(ConfigError, match="min_per_site"):
        budget_heads(scores, Budget.of(flops=0.2), costs, min_per_site=1)  # one head per site costs 25%
    with pytest.raises(ConfigError, match="exactly one budget"):
        budget_heads(scores, Budget.of(keep=0.5, flops=0.5), costs)
    with pytest.raises(ConfigError, match="flops= needs costs"):
        budget_heads(scores, Budget.of(flops=0.5))
    with pytest.raises(ConfigError, match=r"share=1.5; allowed"):
        PruneSettings(share=1.5)
    with pytest.raises(ConfigError, match="scores='magic'; allowed"):
        PruneSettings(share=0.5, scores="magic")


# ---------------------------------------------------------------- rearrangement

def test_rearrangement_never_increases_the_objective_and_keeps_counts():
    g = torch.Generator().manual_seed(0)
    improved = 0
    for trial in range(200):
        h = int(torch.randint(2, 12, (1,), generator=g))
        a = torch.randn(h, 3 + trial % 5, generator=g, dtype=torch.float64)
        block = a @ a.T  # PSD, low rank: strong interactions
        k = int(torch.randint(1, h, (1,), generator=g))
        start = sorted(torch.argsort(block.diagonal())[:k].tolist())  # the diagonal's choice
        new = rearrange_site(block, start)
        assert len(new) == k and len(set(new)) == k and all(0 <= x < h for x in new)
        assert quadratic(block, new) <= quadratic(block, start) + 1e-12
        improved += quadratic(block, new) < quadratic(block, start) - 1e-9
    assert improved > 20  # the off-diagonal terms matter
    model = build("bert")
    fisher = fisher_information(model, _batches("bert"))
    drop = budget_heads(fisher.diag, Budget.of(keep=0.5))
    new = rearrange(drop, fisher)
    assert {k: len(v) for k, v in new.items()} == {k: len(v) for k, v in drop.items()}
    assert fisher.loss_increase(new) <= fisher.loss_increase(drop) + 1e-15


# ---------------------------------------------------------------- tuning and folding

def _o_output(model, batch, site, mask):
    store = {}
    handle = site.o.register_forward_hook(lambda m, a, o: store.setdefault("y", o.detach()))
    with torch.no_grad(), (hp.masked(model, mask) if mask else torch.no_grad()):
        model(**{k: v for k, v in batch.items() if k != "labels"})
    handle.remove()
    return store["y"]


def test_tuning_reduces_the_layer_reconstruction_error():
    model = build("bert")
    calib = _batches("bert", seeds=(1, 2, 3), batch=6)
    drop = {"encoder.0.self": [0, 3], "encoder.1.self": [1]}
    tuned = tune_scales(model, calib, drop, damping=1e-3)
    assert [r["site"] for r in tuned.sites] == ["encoder.0.self", "encoder.1.self"]
    for r in tuned.sites:  # every site, with earlier sites already tuned
        assert r["error_tuned"] < r["error_unit"] and not r["fallback"]
    assert tuned.scales["encoder.0.self"][[0, 3]].abs().sum() == 0
    uncached = tune_scales(model, calib, drop, damping=1e-3, cache_mb=0)  # targets recomputed per site
    for name, s in tuned.scales.items():
        assert torch.allclose(uncached.scales[name], s, atol=1e-6)
    site = hp.find_sites(model)[0]  # recomputed from the model: the first site sees unpruned inputs
    err = {}
    for name, scales in (("unit", None), ("tuned", tuned.scales)):
        total = 0.0
        for batch in calib:
            want = _o_output(model, batch, site, None)
            got = _o_output(model, batch, site, scale_mask(model, drop, scales))
            keep = batch["attention_mask"].bool()
            total += float(((got - want)[keep] ** 2).sum())
        err[name] = total
    assert err["tuned"] < err["unit"]
    assert err["tuned"] == pytest.approx(tuned.sites[0]["error_tuned"], rel=1e-3)


def _norm_input(model, batch, norm, after, mask):
    """The input of ``norm`` the first time it runs after module ``after`` (the residual stream there)."""
    store, armed = {}, []
    hooks = [after.register_forward_hook(lambda *_: armed.append(True)),
             norm.register_forward_pre_hook(lambda m, a: store.setdefault("u", a[0].detach()) if armed else None)]
    with torch.no_grad(), (hp.masked(model, mask) if mask else torch.no_grad()):
        model(**{k: v for k, v in batch.items() if k != "labels" or model.config.is_encoder_decoder})
    for h in hooks:
        h.remove()
    return store["u"]


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2", "bart"])
def test_residual_target_is_the_stream_after_each_site_and_its_error_is_what_the_model_shows(family):
    model = build(family)
    calib = _batches(family, seeds=(1, 2, 3), batch=6)
    sites = hp.find_sites(model)
    norms = residual_norms(model, calib[0], sites)
    assert set(norms) == {s.name for s in sites}  # every site of these families adds into a residual stream
    if family == "bert":  # post-LN: the sublayer's own LayerNorm
        assert all(norms[s.name] is model.bert.encoder.layer[int(s.name.split(".")[1])].attention.output.LayerNorm
                   for s in sites)
    if family == "llama":  # pre-LN: the next sublayer's norm
        assert all(norms[s.name] is model.model.layers[int(s.name.split(".")[1])].post_attention_layernorm
                   for s in sites)
    drop = {s.name: [i % s.num_heads] for i, s in enumerate(sites)}
    tuned = tune_scales(model, calib, drop, damping=1e-3, target="residual")
    mask = scale_mask(model, drop, tuned.scales)
    for row, site in zip(tuned.sites, sites, strict=True):  # later sites do not change an earlier one's stream
        assert row["target"] == "residual" and not row["fallback"]
        assert row["error_tuned"] < row["error_unit"]
        seen = 0.0
        for batch in calib:
            got = _norm_input(model, batch, norms[site.name], site.o, mask)
            want = _norm_input(model, batch, norms[site.name], site.o, None)
            decoder_tokens = model.config.is_encoder_decoder and site.kind != "encoder"
            rows = batch["labels"] != -100 if decoder_tokens else batch["attention_mask"].bool()
            seen += float(((got - want)[rows] ** 2).sum())
        assert seen == pytest.approx(row["error_tuned"], rel=1e-3, abs=1e-6)


def test_guard_turns_down_a_stage_that_raises_the_calibration_loss(monkeypatch):
    from headprune.compression.tuning import TuneResult

    compress_module = sys.modules["headprune.compression.compensations.tune"]  # where tune looks tune_scales up
    model = build("bert")
    calib = _batches("bert", seeds=(1, 2, 3))
    settings = PruneSettings(share=0.5, price="count", compensate="tune", seq_len=8)
    plan = plan_heads(model, calib, settings)
    assert list(plan.losses)[0] == "selected"
    keys = {"rearrange": "rearranged", "tune": "tuned"}
    kept_stages = ["selected", *(keys[s] for s, note in plan.stages.items() if note == "kept")]
    assert all(plan.losses[b] <= plan.losses[a] for a, b in zip(kept_stages, kept_stages[1:], strict=False))

    def harmful(model, batches, drop, **_):  # every kept head blown up
        return TuneResult(scales=scale_mask(model, drop, {s.name: 1e3 * torch.ones(s.num_heads)
                                                           for s in hp.find_sites(model)}))

    monkeypatch.setattr(compress_module, "tune_scales", harmful)
    bad = plan_heads(model, calib, settings)
    assert "tune" in bad.rejected and bad.scales is None and bad.stages["tune"].startswith("rejected (calibration")
    assert bad.losses["tuned"] > min(v for k, v in bad.losses.items() if k != "tuned")
    unguarded = plan_heads(model, calib, PruneSettings(share=0.5, price="count", compensate="tune", seq_len=8,
                                                       guard=False))
    assert unguarded.scales is not None and not unguarded.rejected and not unguarded.losses


@pytest.mark.parametrize("family", ["bert", "llama", "bart", "gpt2"])
def test_folding_equals_the_scales_as_a_mask(family):
    model = build(family)
    g = torch.Generator().manual_seed(3)
    sites = hp.find_sites(model)
    drop = {s.name: [int(torch.randint(s.num_heads, (1,), generator=g))] for s in sites}
    scales = {s.name: 0.5 + torch.rand(s.num_heads, generator=g) for s in sites}
    mask = scale_mask(model, drop, scales)
    x = inputs(family)
    with torch.no_grad(), hp.masked(model, mask):
        want = model(**x).logits
    fold_scales(model, mask)
    with torch.no_grad():
        folded = model(**x).logits
    hp.prune_heads(model, drop)
    with torch.no_grad():
        pruned = model(**x).logits
    assert (folded - want).abs().max().item() <= 1e-5
    assert (pruned - want).abs().max().item() <= 1e-5
    if family == "bart":
        assert any(s.kind == "cross" for s in sites)


@pytest.mark.parametrize("family", ["bert", "bart"])
def test_compressed_model_saves_and_reloads_with_the_same_logits(family, tmp_path):
    model = build(family)
    calib = _batches(family, seeds=(1, 2, 3))
    result = compress(model, calib, PruneSettings(share=0.5, price="count", compensate="tune", seq_len=8, tgt_len=5))
    assert result.sizes["after"]["heads"] == result.sizes["before"]["heads"] // 2
    assert result.sizes["after"]["flops"] < result.sizes["before"]["flops"]
    assert sum(s.num_heads for s in hp.find_sites(model)) == result.sizes["before"]["heads"]  # a copy was pruned
    plan = plan_heads(model, calib, PruneSettings(share=0.5, price="count", compensate="tune", seq_len=8, tgt_len=5))
    x = inputs(family, seed=7)
    with torch.no_grad(), hp.masked(model, plan.mask(model)):
        want = model(**x).logits
    with torch.no_grad():
        got = result.model(**x).logits
    assert (got - want).abs().max().item() <= 1e-5
    hp.save_pruned(result.model, tmp_path / "m")
    again = hp.load_pruned(tmp_path / "m")
    with torch.no_grad():
        assert (again(**x).logits - got).abs().max().item() <= 1e-6
    assert json.loads(json.dumps(result.to_dict()))["kept_heads"] == hp.kept_heads(again)


@pytest.mark.parametrize("share", [0.3, 0.5, 0.7])
def test_flop_budget_is_met_exactly_under_gqa_after_rearrangement(share):
    model = build("llama")
    costs = head_costs(model, 8)
    with pytest.warns(KVCacheWarning) if share == 0.7 else contextlib.nullcontext():  # the free knapsack, uneven
        result = compress(model, _batches("llama"), PruneSettings(share=share, price="flops", compensate="rearrange",
                                                                  seq_len=8, gqa="free"))
    before, after = result.sizes["before"]["attention_flops"], result.sizes["after"]["attention_flops"]
    assert 0 < after <= share * before
    dropped = result.dropped_heads
    for name, heads in dropped.items():  # maximal: no dropped head would still fit
        kept = {k: [h for h in range(6) if h not in dropped.get(k, [])] for k in costs.head}
        for h in heads:
            assert costs.cost({**kept, name: kept[name] + [h]}) > share * before
    assert result.loss_estimate["rearranged"] <= result.loss_estimate["selected"] + 1e-15


# ---------------------------------------------------------------- CLI

TEXTS = ["the film is good", "a bad movie", "great acting and a fine story", "dull and long", "it works well",
         "no", "a charming journey", "bleak and desperate", "fine fine fine", "not good at all"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("compress")
    model = build("bert")
    model.config.id2label, model.config.label2id = {0: "0", 1: "1", 2: "2"}, {"0": 0, "1": 1, "2": 2}
    hp.save_pruned(model, root / "model", tokenizer=word_tokenizer(TEXTS))
    for name, rows in (("dev.tsv", TEXTS), ("train.tsv", TEXTS[::-1] * 2)):
        lines = ["sentence\tlabel"] + [f"{t}\t{i % 2}" for i, t in enumerate(rows)]
        (root / name).write_text("\n".join(lines) + "\n")
    return root


def _cli(saved, out, *extra):
    return runner.invoke(app, ["compress", str(saved / "model"), "--task", "classification",
                               "--data", str(saved / "dev.tsv"), *extra, "-o", str(out)])


def test_cli_compress_end_to_end(saved, tmp_path):
    out = tmp_path / "out"
    result = _cli(saved, out, "--calib-data", str(saved / "train.tsv"), "--share", "0.5", "--price", "count",
                  "--compensate", "tune", "--seq-len", "8", "--bench-batch", "2", "--bench-repeats", "1", "--batch-size", "4")
    assert result.exit_code == 0, result.output
    record = json.loads((out / "compress.json").read_text())
    assert record["sizes"]["after"]["heads"] == 4 and record["settings"]["compensate"] == ["tune"]
    assert set(record["signature"]) >= {"model", "data", "split", "n", "method", "seed", "versions", "calib_data"}
    assert record["speed"]["speedups"][0]["batch"] == 2
    assert "target" not in record["settings"] and record["settings"]["guard"] is True  # tune's own, default
    assert list(record["losses"])[0] == "selected" and isinstance(record["rejected"], list)
    assert record["guard_data"] == "calibration" and record["stages"]["tune"] in ("kept", *(
        f"rejected (calibration loss {record['losses']['tuned']:.4f} > {v:.4f} without it)"
        for v in record["losses"].values()))
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "Mean calibration loss after each stage" in html
    model = hp.load_pruned(out)
    assert sum(s.num_heads for s in hp.find_sites(model)) == 4
    ev = runner.invoke(app, ["evaluate", str(out), "--task", "classification", "--data", str(saved / "dev.tsv"),
                             "--json"])
    assert json.loads(ev.stdout)["score"] == pytest.approx(record["evaluation"]["after"]["score"])


@pytest.mark.parametrize("args, message", [
    (["--share", "0.5", "--n-keep", "3"], "exactly one budget"),
    (["--share", "1.5"], "--share 1.5; allowed"),
    (["--share", "0.5", "--scores", "magic"], "--scores 'magic'; allowed"),
    (["--share", "0.5", "--target", "logits"], "--target 'logits'; allowed: residual, output"),
    (["--share", "0.5", "--calib-data", "DEV"], "is the evaluation data"),
    (["--share", "0.5"], "is the evaluation data"),
    (["--share", "0.5", "--calib-data", "missing.tsv"], "does not exist"),
])
def test_cli_bad_input_exits_2_one_line_nothing_written(saved, tmp_path, args, message):
    args = [str(saved / "dev.tsv") if a == "DEV" else str(tmp_path / a) if a.endswith(".tsv") else a for a in args]
    out = tmp_path / "never"
    result = _cli(saved, out, *args)
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output and not out.exists()


# ---------------------------------------------------------------- benchmark script

def test_method_comparison_quick_writes_valid_json(tmp_path):
    out = tmp_path / "mc.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "method_comparison.py"), "--quick", "--output",
                    str(out)], check=True, capture_output=True, text=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})  # a smoke test: one core is plenty
    data = json.loads(out.read_text())
    methods = {r["method"] for r in data["rows"]}
    assert methods == {"ih", "fisher", "fisher+rearrange", "fisher+tune", "random"}
    for m in methods:
        rows = sorted((r for r in data["summary"] if r["method"] == m), key=lambda r: r["fraction"])
        assert [round(r["fraction"], 1) for r in rows] == [i / 10 for i in range(11)]
        assert rows[0]["score"] == data["unpruned"] and rows[0]["relative"] == 1.0
        assert all(0.0 <= r["relative"] <= 1.5 for r in rows)
    assert data["summary"] and data["timing"]["fisher+tune"]["plan_s"]
    assert set(data["signature"]) >= {"model", "data", "calib_data", "n", "seed", "versions"}
    tests = data["paired_tests"]  # every method but I_h, at every step, against I_h on the same examples
    assert {(t["method"], round(t["fraction"], 1)) for t in tests} == {
        (m, i / 10) for m in methods - {"ih"} for i in range(11)}
    for t in tests:
        assert 0.0 <= t["p_value"] <= 1.0 and t["ci_low"] <= t["diff"] + 1e-12 and t["diff"] <= t["ci_high"] + 1e-12
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
