"""The peer harness's equal privilege (issue #47): SlimGPT's and OSSCAR's knobs chosen per budget on the held-out
calibration blocks (--choose-peer-knobs) -- the point chosen against each point's held-out perplexity computed
here from the model's own loss, the evaluation text never touched by the choice, the row's record and resume --
and calibration drawn from several texts (--calib-mix, --calib-tokens) with held-out blocks disjoint from it."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from peers import calibration, osscar, slimgpt  # noqa: E402

import headprune as hp  # noqa: E402
from headprune.compression.replay import apply_plan  # noqa: E402
from test_peers import batches, llama  # noqa: E402

SHARED = Path(os.environ.get("HEADPRUNE_SHARED_DATA", "/work/shared/data"))
needs_data = pytest.mark.skipif(not (SHARED / "qnli" / "dev.tsv").is_file(), reason="shared data not available")


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _bench():
    spec = importlib.util.spec_from_file_location("llm_peers", ROOT / "benchmarks" / "llm_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def held_out_perplexity(model, blocks: torch.Tensor) -> float:
    """exp(mean token loss) over ``blocks`` [n, T] by the model's own loss (each block T - 1 predicted tokens)."""
    with torch.no_grad():
        losses = [float(model(input_ids=b[None], labels=b[None]).loss) for b in blocks]
    return math.exp(sum(losses) / len(losses))


def quick_data():
    """The quick harness's model, calibration batches and held-out blocks, built here from its documented recipe:
    blocks of 64 tokens of the first half of CPython's docs, 8 for calibration (batches of 4), the next 8 held out."""
    from headprune.evaluation.data import python_docs_text
    from headprune.evaluation.lm import LanguageModelling

    model, tok = _bench().quick_model()
    docs = python_docs_text()
    lm = LanguageModelling(tok, ["\n".join(docs[: len(docs) // 2])], block_size=64, max_blocks=16, batch_size=4)
    return model, list(lm.batches(limit=8)), lm.blocks[8:16]


def test_the_chosen_point_is_the_lowest_held_out_one_the_evaluation_text_unread_and_the_row_resumes(
        tmp_path, monkeypatch):
    bench = _bench()
    eval_tensors: list[torch.Tensor] = []
    seen: list[torch.Tensor] = []  # what the choice scored
    inside = {"choice": False}
    real_sets, real_nll, real_choose = bench.eval_sets, bench.protocol.window_nll, bench.choose_knobs

    def sets(*a, **k):
        out = real_sets(*a, **k)
        eval_tensors.extend(out.values())
        return out

    def nll(model, windows, *a, **k):
        if inside["choice"]:
            if any(windows is t for t in eval_tensors):
                raise AssertionError("the choice read the evaluation text")
            seen.append(windows)
        return real_nll(model, windows, *a, **k)

    def choose(*a, **k):
        inside["choice"] = True
        try:
            return real_choose(*a, **k)
        finally:
            inside["choice"] = False

    def no_text(*a, **k):
        if inside["choice"]:
            raise AssertionError("the choice read a named text")
        return real_text(*a, **k)

    real_text = bench.texts.read
    monkeypatch.setattr(bench, "eval_sets", sets)
    monkeypatch.setattr(bench.protocol, "window_nll", nll)
    monkeypatch.setattr(bench, "choose_knobs", choose)
    monkeypatch.setattr(bench.texts, "read", no_text)
    output = tmp_path / "q.json"
    argv = ["--quick", "--methods", "slimgpt", "--budgets", "0.3", "--choose-peer-knobs", "--output", str(output)]
    out = bench.main(argv)
    (row,) = out["rows"]
    assert row["status"] == "ok", row
    model, calib, held = quick_data()
    assert seen and all(torch.equal(t, held) for t in seen)  # the choice scored the held-out blocks, nothing else
    grid = bench.PEER_GRIDS["slimgpt"]
    points = bench.grid_points(grid)
    assert len(points) == math.prod(len(v) for v in grid.values())
    want = {}
    for point in points:  # each point pruned again here, scored by the model's own loss
        pruned = apply_plan(copy.deepcopy(model), slimgpt.slimgpt_plan(model, calib, 0.3, **point))
        want[json.dumps(point, sort_keys=True)] = held_out_perplexity(pruned, held)
    recorded = {json.dumps(p["settings"], sort_keys=True): p["selection_perplexity"] for p in row["choice"]["points"]}
    assert recorded.keys() == want.keys()
    for key, ppl in want.items():
        assert recorded[key] == pytest.approx(ppl, rel=1e-4)
    best = min(want, key=want.get)
    assert sorted(want.values())[1] / want[best] - 1 > 1e-4  # the choice is not decided by float noise here
    assert json.dumps(row["config"]["chosen"], sort_keys=True) == best
    assert row["choice"]["chosen"] == row["config"]["chosen"] and row["choice"]["grid"] == grid
    assert row["config"]["grid"] == grid and row["config"]["chosen_on"] == "held-out calibration blocks"
    # the row evaluates the chosen point: its own held-out perplexity is the chosen point's
    assert row["selection_perplexity"] == pytest.approx(recorded[best], rel=1e-9)
    assert row["info"]["damping"] == row["config"]["chosen"]["damping"]
    assert row["info"]["first_layer_share"] == row["config"]["chosen"]["first"]
    saved = json.loads(output.read_text())
    assert "peer_knobs" in saved["settings"] and saved["rows"] == json.loads(json.dumps(out["rows"]))

    def refuse(*a, **k):
        raise AssertionError("a finished chosen row was chosen again")

    monkeypatch.setattr(bench, "choose_knobs", refuse)
    again = bench.main(argv)
    assert again["rows"] == out["rows"]  # resumed: the chosen row kept, nothing pruned again


def test_the_file_of_chosen_or_mixed_rows_is_not_the_plain_one():
    bench = _bench()
    plain = bench.results_file(bench.parse([]))
    chosen = bench.results_file(bench.parse(["--choose-peer-knobs"]))
    mixed = bench.results_file(bench.parse(["--calib-mix", "news,wiki", "--calib-tokens", "65536"]))
    both = bench.results_file(bench.parse(["--calib-mix", "news,wiki", "--calib-tokens", "65536",
                                           "--choose-peer-knobs"]))
    assert plain.name == "llm_peers_smollm2.json"
    assert chosen.name == "llm_peers_smollm2_peerknobs.json"
    assert mixed.name == "llm_peers_smollm2_calib-news+wiki-65536.json"
    assert both.name == "llm_peers_smollm2_calib-news+wiki-65536_peerknobs.json"
    with pytest.raises(SystemExit, match="--calib-mix 'news,books'") as err:
        bench.calib_texts("news,books")
    assert "\n" not in str(err.value)


def test_merge_into_a_chosen_file_takes_the_rows_that_do_not_depend_on_the_choice():
    bench = _bench()
    out = {"settings": {"a": 1, "peer_knobs": "chosen"}, "rows": []}
    other = {"settings": {"a": 1}, "command": "x", "rows": [
        {"method": "headprune-fisher", "budget": 0.2, "config": bench.config_of("headprune-fisher")},
        {"method": "flap", "budget": 0.2, "config": bench.config_of("flap")},
        {"method": "slimgpt", "budget": 0.2, "config": bench.config_of("slimgpt")}]}
    assert bench.merge_rows(out, other) == [("headprune-fisher", 0.2), ("flap", 0.2)]
    chosen = bench.config_of("slimgpt", choose=True) | {"chosen": {"damping": 0.1, "first": 1.0}}
    assert bench.merge_rows(out, {**other, "rows": [{"method": "slimgpt", "budget": 0.2, "config": chosen}]}) == [
        ("slimgpt", 0.2)]
    assert bench.knobs_of(chosen) == {"damping": 0.1, "first": 1.0}
    assert bench.knobs_of(bench.config_of("osscar", choose=True) | {"chosen": {"max_swaps": 0}}) == {"max_swaps": 0}
    with pytest.raises(SystemExit, match="--merge"):
        bench.merge_rows(out, {"settings": {"a": 2}, "rows": []})


def test_mixed_blocks_take_the_texts_in_turn_and_hold_out_the_blocks_after_each():
    a = torch.arange(0, 40).view(10, 4)  # text a: 10 blocks of 4 token ids, every id distinct across texts
    b = torch.arange(100, 124).view(6, 4)  # text b: 6 blocks
    calib, held, counts = calibration.mixed_blocks({"a": a, "b": b}, n_calib=12, n_held=4)
    # b holds 2 blocks out, so gives 4 to calibration; a fills the rest: a b a b a b a b a a a a
    want = [a[0], b[0], a[1], b[1], a[2], b[2], a[3], b[3], a[4], a[5], a[6], a[7]]
    assert torch.equal(calib, torch.stack(want))
    assert torch.equal(held, torch.cat([a[8:10], b[4:6]]))  # the blocks right after each text's calibration ones
    assert not set(calib.flatten().tolist()) & set(held.flatten().tolist())
    assert counts == {"a": {"calib_blocks": 8, "held_out_blocks": 2, "blocks_in_text": 10},
                      "b": {"calib_blocks": 4, "held_out_blocks": 2, "blocks_in_text": 6}}
    one, held_one, _ = calibration.mixed_blocks({"a": a}, n_calib=3, n_held=2)  # one text: as the plain harness
    assert torch.equal(one, a[:3]) and torch.equal(held_one, a[3:5])
    batched = calibration.batches_of(calib)
    assert [x["input_ids"].shape[0] for x in batched] == [4, 4, 4]
    assert torch.equal(torch.cat([x["labels"] for x in batched]), calib)


@pytest.mark.parametrize("n_calib, n_held, flag", [(15, 4, "--calib-tokens"), (4, 3, "--select-blocks 3"),
                                                   (4, 14, "--select-blocks 14")])
def test_mixed_blocks_refuse_what_the_texts_cannot_give(n_calib, n_held, flag):
    with pytest.raises(SystemExit, match=flag) as err:
        calibration.mixed_blocks({"a": torch.zeros(10, 4), "b": torch.ones(6, 4)}, n_calib, n_held)
    assert "\n" not in str(err.value)


@needs_data
def test_quick_run_on_mixed_calibration_records_it_and_refuses_the_wiki_text(tmp_path):
    bench = _bench()
    output = tmp_path / "q.json"
    out = bench.main(["--quick", "--methods", "flap", "--budgets", "0.3", "--calib-mix", "news,wiki",
                      "--calib-tokens", "1024", "--output", str(output)])
    s = out["settings"]
    assert s["calib_tokens"] == 1024 and s["calib_blocks"] == 16
    assert {n: (c["calib_blocks"], c["held_out_blocks"]) for n, c in s["calib_mix"].items()} == {
        "news": (8, 4), "wiki": (8, 4)}
    assert s["calib_mix"]["wiki"]["file"] == bench.texts.TEXTS["wiki"][0]
    assert out["rows"][0]["status"] == "ok"
    with pytest.raises(SystemExit, match="--texts wiki") as err:
        bench.main(["--quick", "--calib-mix", "news,wiki", "--calib-tokens", "1024", "--texts", "wiki",
                    "--output", str(output)])
    assert "\n" not in str(err.value)
    with pytest.raises(SystemExit, match="--calib-tokens 1000"):
        bench.main(["--quick", "--calib-tokens", "1000", "--output", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_osscar_head_rounding_floor_and_the_public_codes_count():
    model, data = llama(layers=2), batches()
    ledger_ratio = None
    for rounding in ("floor", "ceil"):
        p = osscar.osscar_plan(model, data, 0.3, head_rounding=rounding, max_swaps=0)
        ledger_ratio = p.info["ratio_per_layer"]
        assert p.info["head_rounding"] == rounding
        for s in hp.find_sites(model):
            n = s.num_heads
            want = int(ledger_ratio * n) if rounding == "floor" else n - int(n * (1 - ledger_ratio))
            assert len(p.dropped_heads.get(s.name, [])) == want
    assert int(ledger_ratio * 6) != 6 - int(6 * (1 - ledger_ratio))  # the two counts differ at this ratio
    with pytest.raises(hp.ConfigError, match="head_rounding='round'"):
        osscar.osscar_plan(model, data, 0.3, head_rounding="round")


def test_slimgpt_first_share_one_is_the_uniform_ratio():
    model, data = llama(layers=4), batches()
    p = slimgpt.slimgpt_plan(model, data, 0.3, first=1.0)
    ratios = p.info["ratios_per_layer"]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-12) and p.info["first_layer_share"] == 1.0
    rising = slimgpt.slimgpt_plan(model, data, 0.3).info["ratios_per_layer"]
    assert rising[0] < rising[-1]
    with pytest.raises(hp.ConfigError, match="first=0"):
        slimgpt.slimgpt_plan(model, data, 0.3, first=0)
