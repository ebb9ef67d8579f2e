"""benchmarks/peers/kwon.py against hand computations on a tiny random BERT (the Fisher against per-example
autograd on an explicitly masked copy, the search against brute force, the rearrangement on a case solved by
hand, the tuning against numpy's lstsq on a system built from single-unit runs), and the encoder harness's
quick run (structure, consistent numbers, resume, the docs block)."""

from __future__ import annotations

import copy
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch
import transformers as T

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from peers import kwon  # noqa: E402

import headprune as hp  # noqa: E402
from headprune.core.model.unit_cost import unit_costs  # noqa: E402


def bert(seed: int = 0):
    torch.manual_seed(seed)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=12,
                          num_labels=3, max_position_embeddings=64, vocab_size=64, pad_token_id=0)
    model = T.BertForSequenceClassification(config).eval()
    with torch.no_grad():  # uneven weights: scores far apart
        for p in model.parameters():
            p.mul_(1 + 3 * torch.rand_like(p))
    return model


def batches(seed: int = 1, n: int = 2, size: int = 3, length: int = 10):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(3, 64, (size, length), generator=g)
        mask = torch.ones_like(x)
        mask[0, length - 3:] = 0  # one padded example per batch
        x[0, length - 3:] = 0
        out.append({"input_ids": x, "attention_mask": mask, "labels": torch.randint(0, 3, (size,), generator=g)})
    return out


def test_fisher_is_per_example_gradients_of_an_explicitly_masked_copy():
    model, data = bert(), batches()
    layers = kwon.encoder_layers(model)
    grads = kwon.mask_gradients(model, data, layers)
    assert all(p.grad is None for p in model.parameters())
    paths = {id(m): n for n, m in model.named_modules()}
    row = 0
    for b in data:
        for i in range(b["input_ids"].shape[0]):
            hm = [torch.ones(lay.site.num_heads, dtype=torch.float64, requires_grad=True) for lay in layers]
            nm = [torch.ones(lay.ffn.width, dtype=torch.float64, requires_grad=True) for lay in layers]
            weights = {}
            for lay, h, n in zip(layers, hm, nm, strict=True):  # the mask as a scale of the weight columns
                weights[paths[id(lay.site.o)] + ".weight"] = lay.site.o.weight * h.repeat_interleave(lay.site.head_dim).float()
                weights[paths[id(lay.ffn.down)] + ".weight"] = lay.ffn.down.weight * n.float()
            one = {k: v[i:i + 1] for k, v in b.items()}
            loss = torch.func.functional_call(model, weights, kwargs=one).loss  # the model's own loss, one example
            g = torch.autograd.grad(loss, [*hm, *nm])
            for j, lay in enumerate(layers):
                torch.testing.assert_close(grads.heads[lay.index][row], g[j], rtol=1e-4,
                                           atol=1e-5 * float(g[j].abs().max()))
                torch.testing.assert_close(grads.neurons[lay.index][row], g[len(layers) + j], rtol=1e-4,
                                           atol=1e-5 * float(g[len(layers) + j].abs().max()))
            row += 1
    fh, fn = grads.fisher()
    for lay in layers:
        torch.testing.assert_close(fh[lay.index], (grads.heads[lay.index] ** 2).sum(0))
        assert fh[lay.index].min() > 0 and fn[lay.index].min() > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("share", [0.3, 0.55, 0.8])
def test_search_equals_brute_force(seed, share):
    g = torch.Generator().manual_seed(seed)
    fh = {0: torch.rand(3, generator=g, dtype=torch.float64), 1: torch.rand(3, generator=g, dtype=torch.float64)}
    fn = {0: torch.rand(4, generator=g, dtype=torch.float64) * 0.6, 1: torch.rand(4, generator=g, dtype=torch.float64) * 0.6}
    cost = kwon.Prices({0: torch.full((3,), 5.0, dtype=torch.float64), 1: torch.full((3,), 5.0, dtype=torch.float64)},
                       {0: torch.full((4,), 2.0, dtype=torch.float64), 1: torch.full((4,), 2.0, dtype=torch.float64)})
    heads, neurons, found = kwon.search(fh, fn, cost, share)
    budget = share * cost.total
    hf, nf = torch.cat([fh[0], fh[1]]), torch.cat([fn[0], fn[1]])
    best = -1.0
    for hs in itertools.product((0, 1), repeat=6):  # every subset of heads and of neurons
        if not any(hs):
            continue
        for ns in itertools.product((0, 1), repeat=8):
            if 5 * sum(hs) + 2 * sum(ns) <= budget + 1e-9:
                best = max(best, float((hf * torch.tensor(hs)).sum() + (nf * torch.tensor(ns)).sum()))
    got = float((hf * torch.cat([heads[0], heads[1]])).sum() + (nf * torch.cat([neurons[0], neurons[1]])).sum())
    assert math.isclose(got, best, rel_tol=1e-12)
    assert math.isclose(found["kept_fisher"], best, rel_tol=1e-12)
    assert cost.kept(heads, neurons) <= budget


def test_rearrange_finds_the_cancelling_pair():
    # unit 2 has the smallest diagonal, but units 0 and 1 cancel: pruning both costs nothing
    g = torch.tensor([[3.0, -3.0, 2.0], [3.0, -3.0, 0.0], [3.0, -3.0, 0.0], [3.0, -3.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([0.0, 1.0, 0.0])  # the diagonal's choice: drop 2 and one of the pair
    out = kwon.rearrange(mask, g)
    assert out.tolist() == [0.0, 0.0, 1.0]

    def cost(m):
        return float(g[:, m == 0].sum(1).pow(2).sum())

    assert cost(out) == 0.0 < cost(mask)
    assert kwon.rearrange(torch.ones(3), g).tolist() == [1.0, 1.0, 1.0]


def _ln_inputs(model, layers, layer, data, heads, neurons, which):
    """Non-padding rows of ``layer``'s LayerNorm input (``ln1`` or ``ln2``) under the masks, by a plain hook."""
    mod = layer.ln_attention if which == "ln1" else layer.ln_ffn
    got = []
    h = mod.register_forward_pre_hook(lambda _m, a: got.append(a[0].detach().double()))
    with torch.no_grad(), kwon.masked(layers, heads, neurons):
        for b in data:
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    h.remove()
    return torch.cat([x[b["attention_mask"].bool()] for x, b in zip(got, data, strict=True)])


def test_tuning_solves_the_hand_built_least_squares_and_lowers_the_error():
    model, data = bert(), batches(n=3)
    layers = kwon.encoder_layers(model)
    ones = ({lay.index: torch.ones(lay.site.num_heads, dtype=torch.float64) for lay in layers},
            {lay.index: torch.ones(lay.ffn.width, dtype=torch.float64) for lay in layers})
    student = ({0: torch.tensor([1.0, 0, 1, 1], dtype=torch.float64), 1: torch.tensor([1.0, 1, 0, 1], dtype=torch.float64)},
               {k: (torch.arange(12) % 3 != 0).double() for k in (0, 1)})
    heads, neurons, log = kwon.tune(model, data, layers, ones, student, first_token_last_ffn=False)
    assert not any(e.get("stopped") for e in log)
    assert [(e["layer"], e["block"]) for e in log] == [(0, "ffn"), (1, "attention"), (1, "ffn")]
    assert torch.equal(heads[0], student[0][0])  # the first layer's heads are not tuned
    # layer 1's attention block, by hand: one column per kept head = the LayerNorm input with only that head on
    # minus with none, over all non-padding tokens; the target is the teacher's minus the same baseline
    lay = layers[1]
    lower = ({0: heads[0]}, {0: neurons[0]})  # the tuned masks below it
    zero = _ln_inputs(model, layers, lay, data, {**lower[0], 1: torch.zeros(4, dtype=torch.float64)}, lower[1], "ln1")
    kept = [0, 1, 3]
    cols = []
    for h in kept:
        e = torch.zeros(4, dtype=torch.float64)
        e[h] = 1
        cols.append((_ln_inputs(model, layers, lay, data, {**lower[0], 1: e}, lower[1], "ln1") - zero).flatten())
    a = torch.stack([*cols, torch.ones_like(cols[0])], 1).numpy()
    b = (_ln_inputs(model, layers, lay, data, *ones, "ln1") - zero).flatten().numpy()
    ata, atb = a.T @ a, a.T @ b
    stacked = np.vstack([ata, np.eye(len(kept) + 1)])  # LSMR's damp=1 on the normal equations, as a stacked system
    d = np.linalg.lstsq(stacked, np.concatenate([atb - ata.sum(1), np.zeros(len(kept) + 1)]), rcond=None)[0]
    want = (1 + d)[:-1]
    np.testing.assert_allclose(heads[1][kept].numpy(), want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
    assert heads[1][2] == 0
    # layer 0's FFN, by hand: one column per kept neuron, the unpruned model below it
    lay = layers[0]
    base = ({0: student[0][0]}, {0: torch.zeros(12, dtype=torch.float64)})
    zero = _ln_inputs(model, layers, lay, data, *base, "ln2")
    kept = torch.nonzero(student[1][0]).flatten().tolist()
    cols = []
    for j in kept:
        e = torch.zeros(12, dtype=torch.float64)
        e[j] = 1
        cols.append((_ln_inputs(model, layers, lay, data, base[0], {0: e}, "ln2") - zero).flatten())
    a = torch.stack(cols, 1).numpy()
    b = (_ln_inputs(model, layers, lay, data, *ones, "ln2") - zero).flatten().numpy()
    ata, atb = a.T @ a, a.T @ b
    d = np.linalg.lstsq(np.vstack([ata, np.eye(len(kept))]), np.concatenate([atb - ata.sum(1), np.zeros(len(kept))]),
                        rcond=None)[0]
    np.testing.assert_allclose(neurons[0][kept].numpy(), 1 + d, rtol=1e-4, atol=1e-6 * np.abs(1 + d).max())
    before = kwon.reconstruction_error(model, data, layers, ones, student)
    after = kwon.reconstruction_error(model, data, layers, ones, (heads, neurons))
    assert after[1]["ffn"] < before[1]["ffn"]  # the model's last block: closer to the unpruned one
    assert after[0]["ffn"] < before[0]["ffn"]


def test_fold_and_surgery_equal_the_masked_model():
    model, data = bert(), batches()
    layers = kwon.encoder_layers(model)
    g = torch.Generator().manual_seed(3)
    heads = {lay.index: torch.rand(4, generator=g, dtype=torch.float64) * torch.tensor([1.0, 0, 1, 1]) for lay in layers}
    neurons = {lay.index: torch.rand(12, generator=g, dtype=torch.float64) * (torch.arange(12) % 4 != 0) for lay in layers}
    x = data[0]
    with torch.no_grad(), kwon.masked(layers, heads, neurons):
        want = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).logits
    folded = copy.deepcopy(model)
    kwon.fold(folded, kwon.encoder_layers(folded), heads, neurons)
    kwon.cut(folded, {lay.site.name: [1] for lay in layers}, {lay.ffn.name: [0, 4, 8] for lay in layers})
    with torch.no_grad():
        got = folded(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("share", [0.5, 0.6])
def test_kwon_prune_keeps_at_most_its_flops(share):
    model, data = bert(), batches(n=3)
    pool = unit_costs(model, "flops", seq_len=16).total()
    result = kwon.kwon_prune(model, data, share, seq_len=16)
    kept = unit_costs(result.model, "flops", seq_len=16).total()
    assert kept <= share * pool
    assert math.isclose(kept, result.info["kept_flops_planned"], rel_tol=1e-9)
    assert kept > 0.8 * share * pool  # the budget is spent, to within a few units
    assert result.info["tuning"] and result.info["teacher_share"] == pytest.approx(math.sqrt(share))
    out = result.model(input_ids=data[0]["input_ids"], attention_mask=data[0]["attention_mask"]).logits
    assert torch.isfinite(out).all()
    assert sum(s.num_heads for s in hp.find_sites(result.model)) == result.info["heads_kept"]


def test_kwon_refuses_a_decoder():
    model = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=37, vocab_size=64))
    with pytest.raises(hp.UnsupportedModelError):
        kwon.encoder_layers(model)


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("encoder_peers", ROOT / "benchmarks" / "encoder_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_rows_are_consistent_resume_and_fill_the_docs(tmp_path):
    bench = _bench()
    output = tmp_path / "q.json"
    flags = ["--quick", "--budgets", "0.5", "--speed-rounds", "1", "--output", str(output)]
    out = bench.main(flags)
    data = json.loads(output.read_text())
    assert data["rows"] == json.loads(json.dumps(out["rows"], default=float))
    assert {"machine", "versions", "command", "settings", "unpruned", "unpruned_sizes"} <= set(data)
    assert {(r["method"], r["budget"]) for r in data["rows"]} == {(m, 0.5) for m in bench.METHODS}
    base, n = data["unpruned"], data["unpruned"]["n"]
    assert math.isclose(base["accuracy"], sum(base["correct"]) / n, rel_tol=1e-12)
    pool = data["unpruned_sizes"]["pool_flops"]
    for r in data["rows"]:
        if r["method"] == "torch-pruning" and r["status"] != "ok":
            assert r["status"] in ("failed", "timeout", "unavailable") and r["error"]
            continue
        assert r["status"] == "ok", r
        assert math.isclose(r["accuracy"], sum(r["correct"]) / n, rel_tol=1e-12)
        assert math.isclose(r["delta"], r["accuracy"] - base["accuracy"], abs_tol=1e-12)
        lo, hi = r["ci95"]
        assert lo - 1e-12 <= r["delta"] <= hi + 1e-12 and 0 <= r["p"] <= 1
        only_base = sum(a and not b for a, b in zip(base["correct"], r["correct"], strict=True))
        only_row = sum(b and not a for a, b in zip(base["correct"], r["correct"], strict=True))
        assert math.isclose(r["delta"], (only_row - only_base) / n, abs_tol=1e-12)
        if only_base + only_row == 0:
            assert r["p"] == 1.0
        assert math.isclose(r["flops_kept"], r["sizes"]["pool_flops"] / pool, rel_tol=1e-12)
        assert r["flops_kept"] <= 0.5 + 1e-9  # no method keeps more than the target
        if r["tool"] != "torch-pruning":
            assert r["flops_kept"] > 0.45  # ... and the unit-level methods spend it, to within a few units
        assert r["sizes"]["total_flops"] < data["unpruned_sizes"]["total_flops"]
        assert r["speedup"] > 0 and len(r["speed"]["seconds"]["pruned"]) == 1
    assert len(data["results"]) == sum(r["status"] == "ok" for r in data["rows"])
    for e in data["results"]:
        assert {"tool", "method", "flops_kept", "accuracy", "delta", "ci95", "p"} <= set(e)
    mine = [r for r in data["rows"] if r["tool"] == "headprune" and r["status"] == "ok"]
    peers = [r for r in data["rows"] if r["tool"] != "headprune" and r["status"] == "ok"]
    chosen = max(mine, key=lambda r: r["selection_accuracy"])  # chosen before the evaluation set is read
    assert data["selected"] == {"0.5": chosen["method"]}
    v = data["verdicts"]["0.5"]
    rival = max(peers, key=lambda r: r["accuracy"])
    assert v["best_peer"] == rival["method"] and v["higher_than_every_peer"] == all(
        chosen["accuracy"] > r["accuracy"] for r in peers)
    only_hp = sum(a and not b for a, b in zip(chosen["correct"], rival["correct"], strict=True))
    only_peer = sum(b and not a for a, b in zip(chosen["correct"], rival["correct"], strict=True))
    assert math.isclose(v["difference"], (only_hp - only_peer) / n, abs_tol=1e-12)
    assert v["ci95"][0] - 1e-12 <= v["difference"] <= v["ci95"][1] + 1e-12
    exact = scipy.stats.binomtest(only_hp, only_hp + only_peer).pvalue if only_hp + only_peer else 1.0
    assert 0 < v["p"] <= exact + 1e-12  # the mid-p is never above the exact McNemar p
    assert v["p_holm"] == v["p"]  # one budget: nothing to adjust
    again = bench.main(flags)
    assert again["rows"] == data["rows"]  # resumed: nothing recomputed
    page = tmp_path / "peers.md"
    page.write_text((ROOT / "docs" / "peers.md").read_text())
    bench.report.write_docs(page, data)
    text = page.read_text()
    assert "<!-- llm_peers:begin -->" in text  # the other block is left alone
    for r in data["rows"]:
        if r["status"] == "ok":
            name = r["method"] + (" (selected)" if r["method"] == chosen["method"] else "")
            assert f"| {name} | 50% | {r['flops_kept']:.3f} |" in text and f"{r['accuracy']:.4f}" in text


@pytest.mark.parametrize("flags, named", [(["--methods", "kwon,sparsegpt"], "--methods"),
                                          (["--budgets", "0.5,1.2"], "--budgets"),
                                          (["--speed-rounds", "0"], "--speed-rounds")])
def test_bad_flags_exit_with_one_line_naming_the_flag(flags, named, tmp_path):
    with pytest.raises(SystemExit, match=named) as err:
        _bench().main(["--quick", *flags, "--output", str(tmp_path / "q.json")])
    assert "\n" not in str(err.value)
    assert not (tmp_path / "q.json").exists()


def test_docs_block_without_results_is_a_note(tmp_path):
    from peers import encoder_report

    page = tmp_path / "peers.md"
    page.write_text((ROOT / "docs" / "peers.md").read_text())
    encoder_report.write_docs(page, None)
    text = page.read_text()
    assert "encoder_peers.json` does not exist yet" in text and "## The protocol" in text
