"""benchmarks/recovery.py, the recovery curve: the quick run's points by their definitions (ratio = perplexity over
the unpruned one on the same windows, recovered share), LoRA trains only its adapters, a rerun skips finished rows,
a continuation starts where its first run ended; bad flags end in one line; the committed docs block is what the
committed results generate."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _bench():
    spec = importlib.util.spec_from_file_location("recovery_curve_bench", ROOT / "benchmarks" / "recovery.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("curve")
    bench = _bench()
    args = ["--quick", "--tokens", "512", "--eval-every", "256", "--budgets", "0.2", "--work", str(tmp / "work"),
            "--output", str(tmp / "out.json")]
    out = bench.main(args)
    return bench, args, tmp, out


def test_points_follow_their_definitions(quick):
    _, _, _, out = quick
    base = out["models"]["quick"]["unpruned"]["perplexity"]
    assert {(r["pruner"], r["recovery"]) for r in out["rows"]} == {("headprune-fisher+linear", "distill"),
                                                                   ("llm-pruner", "lora")}
    for r in out["rows"]:
        assert r["done"] and [p["tokens"] for p in r["points"]] == [0, 256, 512]
        before = out["models"]["quick"]["pruned"][f"{r['pruner']}@0.2"]["perplexity"]
        for p in r["points"]:
            for w, ppl in p["perplexity"].items():
                assert p["ratio"][w] == pytest.approx(ppl / base[w], rel=1e-9)  # same windows, same token counts
                lo, hi = p["ratio_ci95"][w]
                assert lo <= p["ratio"][w] <= hi
                lost = before[w] - base[w]  # nothing lost: no share to recover
                want = (before[w] - ppl) / lost if lost > 0 else None
                assert p["recovered_share"][w] == (want if want is None else pytest.approx(want, rel=1e-9))
        first = r["points"][0]["perplexity"]
        assert first == pytest.approx(before, rel=1e-9)  # step 0 is the pruned model itself
        grid = {float(k): v["held_out_loss"] for k, v in r["lr_selection"]["grid"].items()}
        assert r["lr"] == min(grid, key=grid.get)


def test_lora_trains_only_its_adapters_on_the_texts_loss(quick):
    _, _, _, out = quick
    lora = next(r for r in out["rows"] if r["recovery"] == "lora")
    distill = next(r for r in out["rows"] if r["recovery"] == "distill")
    assert lora["recover_settings"]["objective"] == "lm" and lora["recover_settings"]["train_only"]
    assert distill["recover_settings"]["objective"] == "distill" and distill["recover_settings"]["train_only"] is None


def test_a_rerun_skips_finished_rows_and_a_continuation_starts_where_the_run_ended(quick):
    bench, args, tmp, out = quick
    again = bench.main(args)
    assert again["rows"] == out["rows"]
    more = bench.main([*args[:2], "256", *args[3:], "--continue-from", "512", "--pairs",
                       "headprune:distill"])
    cont = next(r for r in more["rows"] if r["start_tokens"] == 512)
    ended = next(r for r in out["rows"] if r["recovery"] == "distill")["points"][-1]
    assert [p["tokens"] for p in cont["points"]] == [512, 768]
    assert cont["points"][0]["perplexity"] == pytest.approx(ended["perplexity"], rel=1e-6)
    assert cont["recover_settings"]["seed"] == 1 and cont["lr"] == next(
        r for r in out["rows"] if r["recovery"] == "distill")["lr"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--pairs", "flap:distill"], "--pairs 'flap:distill'; allowed"),
    (["--pairs", "llm-pruner:lora", "--continue-from", "512"], "--continue-from with a lora pair"),
    (["--tokens", "0"], "--tokens 0; allowed: an integer >= 1"),
    (["--budgets", "1.5"], "--budgets")])
def test_bad_flags_exit_with_one_line(argv, message):
    with pytest.raises(SystemExit, match=message.replace("(", r"\(")):
        _bench().main(["--quick", *argv])


def test_the_committed_docs_block_is_what_the_committed_results_generate(tmp_path):
    committed = (ROOT / "docs" / "recovery.md").read_text()
    page = tmp_path / "recovery.md"
    page.write_text(committed)
    _bench().main(["--write-docs", str(page)])
    assert page.read_text() == committed, "run: python benchmarks/recovery.py --write-docs docs/recovery.md"
