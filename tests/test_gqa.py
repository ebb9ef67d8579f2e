"""GQA-aware selection (uniform / groups / free) and the KV cache it leaves, measured in a real generate."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import transformers
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.compression import PruneSettings, compress
from headprune.core.model.cost import head_costs
from headprune.core.model.kvcache import kv_cache_bytes
from headprune.errors import ConfigError, KVCacheWarning
from headprune.selection.budgets import Budget, HeadRule
from headprune.selection.gqa import kv_groups, select_gqa
from tiny import build, inputs, labels

runner = CliRunner()
GQA_FAMILIES = ["llama", "qwen2", "mistral"]


def _scores(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {s.name: torch.rand(s.num_heads, generator=g, dtype=torch.float64) for s in hp.find_sites(model)}


def _cache_bytes(model, x) -> tuple[int, int]:
    """(bytes of every key and value tensor the cache holds after generate, tokens cached per example)."""
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0,
              return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(**x, **kw)
    total = 0
    for layer in out.past_key_values.layers:
        for t in (layer.keys, layer.values):
            total += t.numel() * t.element_size()
    return total, out.sequences.shape[1] - 1


def _per_group(groups, kept):
    counts = {}
    for h in kept:
        counts[groups[h]] = counts.get(groups[h], 0) + 1
    return counts


@pytest.mark.parametrize("family", GQA_FAMILIES)
@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.7])
def test_uniform_keeps_the_same_heads_per_group_and_drops_each_groups_lowest(family, fraction):
    model = build(family)
    scores, groups = _scores(model), kv_groups(model)
    total = sum(len(g) for g in groups.values())
    drop = select_gqa(scores, groups, Budget.of(fraction=fraction), HeadRule(gqa="uniform"))
    n = sum(len(v) for v in drop.values())
    assert n <= round(fraction * total)
    step = min(len(set(g)) for g in groups.values())  # heads one uniform step drops in a site
    assert n > round(fraction * total) - step  # short of the count by less than one step
    for name, g in groups.items():
        dropped = set(drop.get(name, []))
        kept = [h for h in range(len(g)) if h not in dropped]
        assert len(set(_per_group(g, kept).values())) <= 1, (name, kept)
        for h in dropped:  # every dropped head scores below every kept head of its own group
            assert all(scores[name][h] <= scores[name][k] for k in kept if g[k] == g[h])


@pytest.mark.parametrize("family", GQA_FAMILIES)
def test_groups_mode_drops_whole_groups(family):
    model = build(family)
    scores, groups = _scores(model, seed=3), kv_groups(model)
    drop = select_gqa(scores, groups, Budget.of(fraction=0.5), HeadRule(gqa="groups"))
    assert drop
    for name, heads in drop.items():
        g = groups[name]
        for j in {g[h] for h in heads}:
            assert {h for h in range(len(g)) if g[h] == j} <= set(heads)


def test_mha_sites_are_unaffected_by_the_mode():
    model = build("bert")
    scores, groups = _scores(model), kv_groups(model)
    want = hp.lowest_heads(scores, n_heads=5)
    for mode in ("uniform", "groups", "free"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert select_gqa(scores, groups, Budget.of(n_drop=5), HeadRule(gqa=mode)) == want


@pytest.mark.parametrize("family", GQA_FAMILIES)
@pytest.mark.parametrize("mode", ["uniform", "groups"])
def test_cache_after_generate_never_grows(family, mode):
    model = build(family)
    x = inputs(family, batch=2, length=6)
    before, steps = _cache_bytes(model, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KVCacheWarning)
        drop = select_gqa(_scores(model, seed=5), kv_groups(model), Budget.of(fraction=0.4),
                          HeadRule(gqa=mode))
    assert drop
    hp.prune_heads(model, drop)
    after, steps_after = _cache_bytes(model, x)
    assert steps_after == steps
    assert after <= before
    # the counter agrees with the cache generate built: bytes per token x tokens x examples
    assert after == kv_cache_bytes(model)["per_token"] * steps * 2


@pytest.mark.parametrize("family", GQA_FAMILIES)
def test_free_warns_with_the_factor_the_cache_grows_by(family):
    model = build(family)
    x = inputs(family, batch=2, length=6)
    before, _ = _cache_bytes(model, x)
    scores = {name: torch.arange(len(g), dtype=torch.float64) for name, g in kv_groups(model).items()}
    with pytest.warns(KVCacheWarning) as record:
        drop = select_gqa(scores, kv_groups(model), Budget.of(n_drop=1),
                          HeadRule(gqa="free"))  # one head: groups left uneven
    hp.prune_heads(model, drop)
    after, _ = _cache_bytes(model, x)
    assert after > before
    assert f"{after / before:.2f}x" in str(record[0].message)


def test_kv_budget_keeps_at_most_that_share_of_the_cache():
    model = build("llama")
    before = kv_cache_bytes(model)["per_token"]
    x = inputs("llama", batch=4)
    x["labels"] = labels("llama", x)
    result = compress(model, [x], PruneSettings(share=0.5, price="kv", scores="ih"))
    after = kv_cache_bytes(result.model)["per_token"]
    assert 0 < after <= 0.5 * before
    assert result.sizes["after"]["kv_cache_bytes_per_token"] == after


@pytest.mark.parametrize("scores, compensate", [("ih", "none"), ("fisher", "rearrange")])
def test_compress_default_never_enlarges_the_cache(scores, compensate):
    model = build("llama")
    before = kv_cache_bytes(model)
    x = inputs("llama", batch=4)
    x["labels"] = labels("llama", x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KVCacheWarning)
        result = compress(model, [x], PruneSettings(share=0.5, price="count", scores=scores, compensate=compensate))
    after = kv_cache_bytes(result.model)
    assert all(after["kv_heads"][k] <= before["kv_heads"][k] for k in after["kv_heads"])
    for name, kept in result.kept_heads.items():
        counts = _per_group(kv_groups(model)[name], kept)
        assert len(set(counts.values())) <= 1, (name, kept)


def test_select_refuses_bad_input():
    model = build("llama")
    scores, groups = _scores(model), kv_groups(model)
    with pytest.raises(ConfigError, match="gqa='even'"):
        select_gqa(scores, groups, Budget.of(n_drop=1), HeadRule(gqa="even"))
    with pytest.raises(ConfigError, match="budget=0.5; allowed: a Budget"):
        select_gqa(scores, groups, 0.5)
    with pytest.raises(ConfigError, match="a share of params; allowed here: a budget in count or flops or kv"):
        select_gqa(scores, groups, Budget.of(price="params", share=0.5))
    with pytest.raises(ConfigError, match="exactly one budget"):
        select_gqa(scores, groups, Budget.of(n_drop=1, fraction=0.5))
    with pytest.raises(ConfigError, match="kv= needs costs="):
        select_gqa(scores, groups, Budget.of(kv=0.5))


def test_cli_refuses_unknown_gqa_mode(tmp_path):
    out = tmp_path / "out"
    r = runner.invoke(app, ["compress", str(tmp_path), "--task", "lm", "--data", "builtin:pydoc", "--share", "0.5",
                            "--gqa", "even", "-o", str(out)])
    assert r.exit_code == 2 and "--gqa 'even'" in r.output and not out.exists()


@pytest.mark.parametrize("mode", ["uniform", "groups"])
@pytest.mark.parametrize("share", [0.3, 0.6])
def test_flop_budget_under_a_gqa_mode_is_met_without_growing_the_cache(mode, share):
    model = build("llama")
    costs = head_costs(model, 8)
    groups = kv_groups(model)
    drop = select_gqa(_scores(model), groups, Budget.of(flops=share), HeadRule(gqa=mode), costs)
    kept = {k: [h for h in range(len(g)) if h not in drop.get(k, [])] for k, g in groups.items()}
    assert costs.cost(kept) <= share * costs.total() + 1e-6
    before = kv_cache_bytes(model)["per_token"]
    hp.prune_heads(model, drop)
    assert flop_share(model, costs) == pytest.approx(costs.cost(kept) / costs.total())  # the counter agrees
    assert kv_cache_bytes(model)["per_token"] <= before


def flop_share(model, costs_before) -> float:
    after = head_costs(model, 8)
    return after.total() / costs_before.total()


def test_cli_compress_a_gqa_lm_on_text_files(tmp_path):
    from tiny import word_tokenizer

    words = "the model keeps the heads it needs and the cache stays small while the text goes on".split()
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (60,), generator=g)) for _ in range(12)]
    (tmp_path / "calib.txt").write_text("\n".join(lines[:6]) + "\n")
    (tmp_path / "eval.txt").write_text("\n".join(lines[6:]) + "\n")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(  # positions for the lm task's 128-token blocks
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=37,
        max_position_embeddings=160, vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    hp.save_pruned(model, tmp_path / "llama", tokenizer=word_tokenizer(lines, bos_eos=True))
    out = tmp_path / "out"
    r = runner.invoke(app, ["compress", str(tmp_path / "llama"), "--task", "lm", "--data", str(tmp_path / "eval.txt"),
                            "--calib-data", str(tmp_path / "calib.txt"), "--share", "0.5",
                            "--price", "count", "--compensate", "tune", "--no-bench", "-o", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "compress.json").read_text())
    sizes = report["sizes"]
    assert sizes["after"]["kv_cache_bytes_per_token"] <= sizes["before"]["kv_cache_bytes_per_token"]
    pruned = hp.load_pruned(out)
    for name, kept in hp.kept_heads(pruned).items():
        assert len(set(_per_group(kv_groups(model)[name], kept).values())) <= 1, (name, kept)


@pytest.mark.parametrize("mode", ["uniform", "groups"])
@pytest.mark.parametrize("n", [4, 8, 11])
def test_same_per_site_drops_the_same_count_everywhere(mode, n):
    model = build("qwen2")  # 6 query heads over 3 key/value heads
    scores, groups = _scores(model, seed=9), kv_groups(model)
    drop = select_gqa(scores, groups, Budget.of(n_drop=n), HeadRule(gqa=mode, same_per_site=True))
    counts = [len(drop.get(name, [])) for name in groups]
    step = len(groups) * 2 if mode == "groups" else len(groups) * 3  # one group of 2 / one head of 3 groups per site
    assert len(set(counts)) == 1 and sum(counts) <= n and sum(counts) > n - step
    for name, g in groups.items():
        kept = [h for h in range(len(g)) if h not in drop.get(name, [])]
        assert len(set(_per_group(g, kept).values())) <= 1


def test_cli_prune_says_when_an_explicit_plan_grows_the_cache(tmp_path):
    hp.save_pruned(build("llama"), tmp_path / "llama")
    r = runner.invoke(app, ["prune", str(tmp_path / "llama"), "--drop", '{"decoder.0.self": [0]}', "-o",
                            str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    # decoder.0 keeps 5 query heads over 2 key/value heads: 5 cached instead of 2; the model 7 of 4 heads
    assert "KV cache 1.75x the unpruned one (decoder.0.self: 2.50x, 5 key/value heads cached instead of 2)" in r.output
    even = runner.invoke(app, ["prune", str(tmp_path / "llama"), "--drop", '{"decoder.0.self": [0, 3]}', "-o",
                               str(tmp_path / "even")])
    assert even.exit_code == 0 and "KV cache" not in even.output
