"""Act two of the demo: the library's FLAP is the peer benchmark's, the demo's headprune configuration is the peer
table's, and the perplexity ratios' intervals are paired bootstraps over the held-out blocks. (The quick demo running
both acts, its summary table and figure: test_cli.py's quick demo test.)"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # peers, demo_results
from peers import flap as bench_flap  # noqa: E402
from peers import plan as bench_plan  # noqa: E402
from peers.headprune_rows import settings_for  # noqa: E402

from headprune.compression import replay  # noqa: E402
from headprune.errors import ConfigError  # noqa: E402
from headprune.evaluation.base import EvalResult  # noqa: E402
from headprune.evaluation.significance import perplexity_ratio  # noqa: E402
from headprune.experiments.demo_compress import HEADPRUNE, compress_settings  # noqa: E402
from headprune.peers import flap  # noqa: E402
from test_peers import batches, llama  # noqa: E402


@pytest.mark.parametrize("budget", [0.1, 0.3])
def test_library_flap_is_the_benchmark_flap(budget):
    """The peer benchmark's plan is built from the library's cut, and both ways of applying it compute the same."""
    model, data = llama(layers=4), batches()
    cut = flap.flap(model, data, budget)
    plan = bench_flap.flap_plan(model, data, budget)  # headprune's Plan, built by the harness from the cut
    assert plan.dropped_heads == {k: v for k, v in cut.heads.items() if v} and (cut.heads or cut.neurons)
    assert plan.dropped_neurons == {k: v for k, v in cut.neurons.items() if v}
    assert set(plan.added_biases) == set(cut.biases) and cut.biases
    assert {k: v for k, v in plan.info.items() if k not in ("seconds", "method")} == {
        k: v for k, v in cut.info.items() if k != "seconds"}
    probe = batches(seed=9, n=1)[0]["input_ids"]
    with torch.no_grad():
        ours = flap.apply_flap(copy.deepcopy(model), cut)(input_ids=probe).logits  # the library's FLAP
        theirs = replay.apply_plan(copy.deepcopy(model), plan)(input_ids=probe).logits  # the harness's plan replayed
    assert (ours - theirs).abs().max() <= 1e-6 * theirs.abs().max()
    removed = bench_plan.nonembedding_params(model) - bench_plan.nonembedding_params(
        flap.apply_flap(copy.deepcopy(model), cut))
    assert removed == cut.info["planned_removed"] >= math.ceil(budget * bench_plan.nonembedding_params(model))


def test_the_demo_uses_the_peer_tables_configuration():
    """The demo cannot import benchmarks/: its settings must stay those of benchmarks/peers/headprune_rows.py."""
    model = llama(layers=4)
    for budget in (0.1, 0.2):
        ours, table = compress_settings(model, budget).to_dict(), settings_for(HEADPRUNE, model, budget).to_dict()
        assert ours == {**table, "multiple_of": 32}  # widths on Q8_0's block, as the README's llama.cpp table


def _result(nll_sum, tokens, metric="perplexity") -> EvalResult:
    nll_sum, tokens = np.asarray(nll_sum, dtype=np.float64), np.asarray(tokens, dtype=np.int64)
    return EvalResult(metric=metric, score=math.exp(nll_sum.sum() / tokens.sum()), n=len(nll_sum),
                      per_example={"nll_sum": nll_sum, "tokens": tokens}, higher_is_better=False)


def test_perplexity_ratio_by_hand():
    rng = np.random.default_rng(3)
    tokens = rng.integers(50, 130, size=40)
    base = _result(rng.uniform(2.5, 4.0, size=40) * tokens, tokens)
    # every block 0.1 nats per token worse: every resample gives the same ratio, exp(0.1), and so does the interval
    shifted = perplexity_ratio(base, _result(base.per_example["nll_sum"] + 0.1 * tokens, tokens))
    for key in ("ratio", "ci_low", "ci_high"):
        assert shifted[key] == pytest.approx(math.exp(0.1), rel=1e-9)
    noisy = _result(base.per_example["nll_sum"] + rng.normal(0.05, 0.3, size=40) * tokens, tokens)
    got = perplexity_ratio(base, noisy, n_resamples=2000)
    assert got["ratio"] == pytest.approx(noisy.score / base.score, rel=1e-12)
    # an independent percentile bootstrap of the ratio over the same blocks: about the same interval
    draws = rng.integers(0, 40, size=(4000, 40))
    a, b, t = (x[draws].sum(1) for x in (base.per_example["nll_sum"], noisy.per_example["nll_sum"], tokens))
    low, high = np.exp(np.percentile((b - a) / t, [2.5, 97.5]))
    assert got["ci_low"] < got["ratio"] < got["ci_high"]
    assert (got["ci_high"] - got["ci_low"]) == pytest.approx(high - low, rel=0.15)
    with pytest.raises(ConfigError, match="base: a 'accuracy' result"):
        perplexity_ratio(_result([1.0], [1], metric="accuracy"), noisy)


def test_the_demo_record_holds_act_two_and_its_check_compares_it(tmp_path):
    """benchmarks/demo_results.py copies act two's numbers from a run and --check names each that moved."""
    import json

    import demo_results

    from headprune.experiments.demo import run_demo

    run_demo(tmp_path / "run", mode="quick", progress=False)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    record = demo_results.demo_record(tmp_path / "run", "test machine")
    second = record["act_two"]
    assert second["headprune"]["perplexity"] == results["act_two"]["headprune"]["perplexity"]
    assert second["flap"]["perplexity"] == results["act_two"]["flap"]["perplexity"]
    assert second["recovered"]["tokens"] == 1024 and second["gguf_bytes"] is None  # quick: no GGUF files
    assert demo_results.reproduces(tmp_path / "run", record) == []
    moved = json.loads(json.dumps(record))
    moved["act_two"]["flap"]["perplexity"] *= 1.01
    moved["act_two"]["recovered"]["tokens"] = 2048
    problems = demo_results.reproduces(tmp_path / "run", moved)
    assert len(problems) == 2 and "act two: perplexity flap" in problems[1] and "2,048" in problems[0]
    del moved["act_two"]
    moved["perplexity"]["pruned"] *= 1.01  # act one's numbers are still compared
    problems = demo_results.reproduces(tmp_path / "run", moved)
    assert len(problems) == 2 and problems[0].startswith("act two: the committed record has none")
    assert problems[1].startswith("perplexity pruned:")
    check_quotes_resolve(record, tmp_path / "bench")


def check_quotes_resolve(record: dict, bench) -> None:
    """Every ``demo:act_two.*`` quote in the docs names a field of the record (the committed demo.json is
    regenerated from the real run; until then the docs hold placeholders that studies/summarize.py --fix fills)."""
    import json
    import re

    sys.path.insert(0, str(ROOT / "studies"))
    import quotes
    import summarize

    bench.mkdir()
    record = json.loads(json.dumps(record))
    record["act_two"]["gguf_bytes"] = {"unpruned": 145_000_000, "pruned": 118_000_000}  # quick: no files written
    (bench / "demo.json").write_text(json.dumps(record))
    names = {m for doc in summarize.DOCS for m in re.findall(r"<!--q:(demo:act_two\.[^>]*?)-->",
                                                                (ROOT / doc).read_text())}
    assert len(names) >= 10
    saved = quotes.BENCH
    quotes.BENCH = bench
    quotes.load.cache_clear()
    try:
        shown = {n: quotes.quote(n) for n in names}
    finally:
        quotes.BENCH = saved
        quotes.load.cache_clear()
    assert shown["demo:act_two.recovered.tokens~d"] == "1,024"
    assert shown["demo:act_two.flap.perplexity"] == f"{record['act_two']['flap']['perplexity']:.2f}"
    assert shown["demo:act_two.gguf_bytes.pruned~MB"] == "118 MB"
