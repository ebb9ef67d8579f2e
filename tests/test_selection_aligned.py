"""``multiple_of``: selection in whole blocks (headprune.selection.aligned) against brute force over every
subset of units, and through ``compress`` on a tiny Llama (widths a multiple of N, pruned == a stock shape)."""

from __future__ import annotations

import itertools

import pytest
import torch

import headprune as hp
from headprune.core.model.unit_cost import UnitCosts
from headprune.errors import ConfigError
from headprune.selection.aligned import Widths, aligned_blocks, select_aligned
from headprune.selection.budgets import Budget, HeadRule


def test_blocks_leave_a_multiple_after_each():
    # 9 heads of 64, blocks of 128: drop 1 (8 left), then 2 at a time
    assert aligned_blocks([1] * 9, 9, 2) == [[0], [1, 2], [3, 4], [5, 6], [7, 8]]
    # GQA steps of 3 heads (one per key/value group) from 12 heads, an even count kept: two steps per block
    assert aligned_blocks([3] * 4, 12, 2) == [[0, 1], [2, 3]]
    assert aligned_blocks([1] * 4, 4, 1) == [[0], [1], [2], [3]]
    with pytest.raises(ConfigError, match="add up"):
        aligned_blocks([1, 1], 3, 2)


def _brute(scores: dict[str, torch.Tensor], prices: dict[str, torch.Tensor], budget: float, multiple: int):
    """The best kept score over every subset of every FFN's neurons whose kept count is a multiple of
    ``multiple`` or the whole width, within the budget (no blocks, no ranking: plain enumeration)."""
    names = list(scores)
    options = {}
    for n in names:
        w = scores[n].numel()
        options[n] = [(float(scores[n][list(c)].sum()), float(prices[n][list(c)].sum()))
                      for k in range(w + 1) if k % multiple == 0 or k == w
                      for c in itertools.combinations(range(w), k)]
    best = -float("inf")
    for combo in itertools.product(*(options[n] for n in names)):
        if sum(p for _, p in combo) <= budget * (1 + 1e-12):
            best = max(best, sum(s for s, _ in combo))
    return best


def _kept_score(scores, prices, dropped):
    score = price = 0.0
    for n, sc in scores.items():
        keep = [i for i in range(sc.numel()) if i not in set(dropped[n])]
        score += float(sc[keep].sum())
        price += float(prices[n][keep].sum())
    return score, price


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("share", [0.3, 0.55, 0.8])
def test_neurons_against_brute_force(seed, share):
    g = torch.Generator().manual_seed(seed)
    widths, multiple = {"a": 8, "b": 6, "c": 5}, 4  # b and c are not multiples: their first block takes the rest
    scores = {n: torch.rand(w, generator=g, dtype=torch.float64) for n, w in widths.items()}
    prices = {"a": torch.full((8,), 1.0, dtype=torch.float64), "b": torch.full((6,), 2.5, dtype=torch.float64),
              "c": torch.full((5,), 0.7, dtype=torch.float64)}
    costs = UnitCosts({}, prices, "params")
    _, dropped, summary = select_aligned({}, scores, costs, Budget.of(share=share), Widths(multiple, {}),
                                         units="neurons")
    total = sum(float(p.sum()) for p in prices.values())
    got, spent = _kept_score(scores, prices, dropped)
    assert spent <= share * total * (1 + 1e-12) and spent == pytest.approx(summary["price_kept"])
    for n, w in widths.items():
        kept = w - len(dropped[n])
        assert kept % multiple == 0 or kept == w, (n, kept)
    best = _brute(scores, prices, share * total, multiple)
    # the greedy knapsack over blocks: within one block's score of the best choice (a block: at most 4 neurons)
    max_block = max(float(sc.sort().values[-multiple:].sum()) for sc in scores.values())
    assert best - max_block - 1e-9 <= got <= best + 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_one_price_and_whole_blocks_is_exact(seed):
    g = torch.Generator().manual_seed(100 + seed)
    scores = {n: torch.rand(8, generator=g, dtype=torch.float64) for n in ("a", "b")}
    prices = {n: torch.ones(8, dtype=torch.float64) for n in scores}
    for share in (0.25, 0.5, 0.75):
        _, dropped, _ = select_aligned({}, scores, UnitCosts({}, prices, "params"), Budget.of(share=share),
                                       Widths(4, {}), units="neurons")
        got, _ = _kept_score(scores, prices, dropped)
        assert got == pytest.approx(_brute(scores, prices, share * 16, 4))


def test_heads_aligned_to_the_width_and_min_per_site():
    g = torch.Generator().manual_seed(0)
    # 9 heads of 64 (SmolLM2's attention), N = 128: kept heads even (or all 9); min 4 heads per site
    scores = {f"decoder.{i}.self": torch.rand(9, generator=g, dtype=torch.float64) for i in range(3)}
    prices = {k: torch.ones(9, dtype=torch.float64) for k in scores}
    drop, _, summary = select_aligned(scores, {}, UnitCosts(prices, {}, "params"), Budget.of(share=0.5),
                                      Widths(128, dict.fromkeys(scores, 64)), units="heads",
                                      rule=HeadRule(min_per_site=4))
    for site, d in drop.items():
        kept = 9 - len(d)
        assert (kept * 64) % 128 == 0 or kept == 9
        assert kept >= 4
        # what a site keeps is its best heads: every kept head scores at least as high as every dropped one
        kept_idx = [i for i in range(9) if i not in d]
        if d:
            assert float(scores[site][kept_idx].min()) >= float(scores[site][d].max())
    assert summary["kept"]["heads"] == sum(9 - len(d) for d in drop.values())


def test_gqa_steps_keep_groups_even_and_widths_aligned():
    g = torch.Generator().manual_seed(1)
    # 12 query heads over 4 key/value groups (3 each), head_dim 32, N = 64: kept heads even and even per group
    groups = {"decoder.0.self": [h // 3 for h in range(12)], "decoder.1.self": [h // 3 for h in range(12)]}
    scores = {k: torch.rand(12, generator=g, dtype=torch.float64) for k in groups}
    prices = {k: torch.ones(12, dtype=torch.float64) for k in groups}
    for share in (0.3, 0.6, 0.9):
        drop, _, _ = select_aligned(scores, {}, UnitCosts(prices, {}, "params"), Budget.of(share=share),
                                    Widths(64, dict.fromkeys(groups, 32)), units="heads", groups=groups)
        for site, d in drop.items():
            kept = [h for h in range(12) if h not in d]
            assert (len(kept) * 32) % 64 == 0
            per_group = [sum(groups[site][h] == grp for h in kept) for grp in range(4)]
            assert len(set(per_group)) == 1  # uniform: the same count in every group


def test_bad_multiple_is_refused_with_its_name():
    with pytest.raises(ConfigError, match="multiple_of=0"):
        select_aligned({}, {"a": torch.ones(4)}, UnitCosts({}, {"a": torch.ones(4)}, "params"),
                       Budget.of(share=0.5), Widths(0, {}), units="neurons")
    with pytest.raises(ConfigError, match="multiple_of"):
        hp.PruneSettings(units="both", share=0.5, multiple_of=-2)
    # the head plan (a count budget) cannot align widths: refused, naming the setting that needs the other path
    with pytest.raises(ConfigError, match=r"price='count' with multiple_of=32"):
        hp.PruneSettings(units="heads", share=0.5, price="count", multiple_of=32)
    assert not hp.PruneSettings(units="heads", share=0.5, multiple_of=32).head_plan


def test_compress_with_multiple_of_keeps_aligned_widths():
    from tiny import llama  # hidden 48, 6 heads of 8 (2 key/value groups), FFN 37

    torch.manual_seed(0)
    model = llama().eval()
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(3, 64, (4, 16), generator=g)} for _ in range(4)]
    for b in batches:
        b["labels"] = b["input_ids"].clone()
    settings = hp.PruneSettings(units="both", share=0.6, price="params", compensate="none", multiple_of=16)
    result = hp.compress(model, batches, settings)
    pruned = result.model
    widths = [f.width for f in hp.find_ffns(pruned)]
    attention = [s.num_heads * s.head_dim for s in hp.find_sites(pruned)]
    assert all(w % 16 == 0 or w == 37 for w in widths) and any(w != 37 for w in widths)
    assert all(a % 16 == 0 or a == 48 for a in attention)
    assert result.selection["multiple_of"] == 16
    params = sum(p.numel() for p in pruned.parameters())
    assert params < sum(p.numel() for p in model.parameters())


def test_cli_multiple_of(tmp_path):
    import json

    from typer.testing import CliRunner

    from headprune.cli import app
    from tiny import build, word_tokenizer

    texts = ["a good film", "a bad film", "the plot was thin", "wonderful acting", "dull and long", "loved it",
             "a charming journey", "bleak and desperate", "fine fine fine", "not good at all"]
    model = build("bert")  # hidden 32, 4 heads of 8, FFN 37
    model.config.id2label, model.config.label2id = {0: "0", 1: "1", 2: "2"}, {"0": 0, "1": 1, "2": 2}
    hp.save_pruned(model, tmp_path / "model", tokenizer=word_tokenizer(texts))
    (tmp_path / "d.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(texts)))
    base = ["compress", str(tmp_path / "model"), "--task", "classification", "--data", str(tmp_path / "d.tsv"),
            "--calib-data", str(tmp_path / "d.tsv"), "--allow-same-data", "--seq-len", "8", "--batch-size", "4",
            "--units", "both", "--share", "0.5", "--price", "params", "--compensate", "none", "--no-bench"]
    runner = CliRunner()
    result = runner.invoke(app, [*base, "--multiple-of", "16", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    pruned = hp.load_pruned(tmp_path / "out")
    assert all(f.width % 16 == 0 or f.width == 37 for f in hp.find_ffns(pruned))
    assert all((s.num_heads * s.head_dim) % 16 == 0 for s in hp.find_sites(pruned))
    assert json.loads((tmp_path / "out" / "compress.json").read_text())["selection"]["multiple_of"] == 16
    bad = runner.invoke(app, [*base, "--multiple-of", "0", "-o", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "--multiple-of 0" in bad.output and not (tmp_path / "bad").exists()
