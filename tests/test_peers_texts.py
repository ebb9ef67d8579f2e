"""The peer harness's extra evaluation texts (issue #34): what they read, that nothing chooses with them, the
verdict per text by hand, and a quick run scoring kept and re-pruned rows alike."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import texts  # noqa: E402

SHARED = Path(os.environ.get("HEADPRUNE_SHARED_DATA", "/work/shared/data"))
needs_data = pytest.mark.skipif(not (SHARED / "qnli" / "dev.tsv").is_file(), reason="shared data not available")


def _bench():
    spec = importlib.util.spec_from_file_location("llm_peers", ROOT / "benchmarks" / "llm_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_data
def test_texts_read_the_distinct_wikipedia_sentences_and_every_caption():
    wiki, d = texts.read("wiki", SHARED)
    with (SHARED / "qnli" / "dev.tsv").open(encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    seen: list[str] = []
    for r in rows:  # columns: index, question, sentence, label
        if r[2] not in seen:
            seen.append(r[2])
    assert wiki.split("\n") == seen and d["lines"] == len(seen) > 3000
    captions, d = texts.read("captions", SHARED)
    with gzip.open(SHARED / "multi30k" / "test_2018_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    assert captions.split("\n") == lines and d["lines"] == len(lines)
    assert len({texts.read(n, SHARED)[1]["sha256"] for n in texts.TEXTS}) == len(texts.TEXTS)


def test_no_calibration_or_selection_reads_the_extra_texts():
    """The extra texts are for evaluation only: no benchmark, the demo or the library names their files."""
    for name, (rel, _) in texts.TEXTS.items():
        needle = rel.split("/")[0] if name == "wiki" else Path(rel).name.split(".")[0]  # qnli, test_2018_flickr
        found = subprocess.run(["grep", "-rlI", needle, "benchmarks", "src/headprune"], cwd=ROOT,
                               capture_output=True, text=True).stdout.split()
        found = [f for f in found if not f.startswith("benchmarks/results/") and f != "benchmarks/peers/texts.py"
                 and "__pycache__" not in f]
        assert found == [], f"{needle} is read by {found}"


def test_unknown_text_exits_naming_the_flag():
    with pytest.raises(SystemExit, match="--texts 'novel'; allowed: "):
        texts.read("novel", SHARED)


def test_verdict_by_hand():
    tokens = [10, 10, 10]
    best = {"method": "h", "perplexity": {"w": 5.0}, "ratio": {"w": 1.1}, "ratio_ci95": {"w": [1.0, 1.2]},
            "nll_sum": {"w": [14.0, 16.0, 18.0]}}
    peers = [{"method": "a", "perplexity": {"w": 6.0}, "ratio": {"w": 1.3}, "nll_sum": {"w": [16.0, 18.0, 20.0]}},
             {"method": "b", "perplexity": {"w": 4.0}, "ratio": {"w": 1.05}, "nll_sum": {"w": [13.0, 15.0, 17.0]}}]
    v = texts.verdict(best, peers, tokens, "w")
    assert v["best_peer"] == "b" and v["best_peer_perplexity"] == 4.0
    assert not v["lower_than_every_peer"] and not v["interval_below_best_peer"]
    assert v["ratio_to_best_peer"] == pytest.approx(math.exp((48.0 - 45.0) / 30), rel=1e-12)
    assert v["ratio_to_best_peer_ci95"][0] <= v["ratio_to_best_peer"] <= v["ratio_to_best_peer_ci95"][1]


@needs_data
def test_quick_rows_scored_on_the_texts_from_kept_and_re_pruned_models_agree(tmp_path):
    bench = _bench()
    output, kept = tmp_path / "q.json", tmp_path / "models"
    common = ["--quick", "--methods", "shortgpt,headprune-fisher", "--budgets", "0.3", "--output", str(output)]
    out = bench.main([*common, "--keep-models", str(kept)])
    assert all(r["status"] == "ok" for r in out["rows"]) and len(list(kept.iterdir())) == 2
    first = bench.main([*common, "--keep-models", str(kept), "--texts", "wiki,captions"])
    assert json.loads(output.read_text())["rows"] == out["rows"]  # the rows' file is only read
    assert {(r["method"], r["text"]) for r in first["rows"]} == {
        (m, t) for m in ("shortgpt", "headprune-fisher") for t in ("wiki", "captions")}
    assert all(r["status"] == "ok" and r["model_from"].startswith("kept model") for r in first["rows"])
    for r in first["rows"]:  # the ratio is the perplexities' ratio on the same windows
        for p, ppl in r["perplexity"].items():
            assert r["ratio"][p] == pytest.approx(ppl / first["unpruned"][r["text"]]["perplexity"][p], rel=1e-9)
    assert set(first["verdicts"]) == {"wiki", "captions"}
    assert first["verdicts"]["wiki"]["0.3"]["window128"]["best_peer"] == "shortgpt"
    stale = json.loads(bench.texts_file(output).read_text())  # a text row of an earlier model of its row
    for r in stale["rows"]:
        if (r["method"], r["text"]) == ("headprune-fisher", "wiki"):
            r["selection_perplexity"] += 1.0
            r["perplexity"] = {p: -1.0 for p in r["perplexity"]}
    bench.texts_file(output).write_text(json.dumps(stale))
    rescored = bench.main([*common, "--keep-models", str(kept), "--texts", "wiki"])
    assert sorted((r["method"], r["text"]) for r in rescored["rows"]) == sorted((r["method"], r["text"])
                                                                               for r in first["rows"])
    for r in rescored["rows"]:
        old = next(x for x in first["rows"] if (x["method"], x["text"]) == (r["method"], r["text"]))
        assert r["perplexity"] == old["perplexity"] and r["selection_perplexity"] == old["selection_perplexity"]
    bench.texts_file(output).unlink()
    again = bench.main([*common, "--texts", "wiki"])  # no kept models: each method pruned again
    assert all(r["model_from"].startswith("pruned again") for r in again["rows"])
    for r in again["rows"]:
        old = next(x for x in first["rows"] if (x["method"], x["text"]) == (r["method"], r["text"]))
        for p in r["perplexity"]:
            assert r["perplexity"][p] == pytest.approx(old["perplexity"][p], rel=1e-5)


def test_merge_adds_only_missing_rows_of_the_same_settings():
    bench = _bench()
    cfg = bench.config_of("shortgpt")
    out = {"settings": {"a": 1}, "rows": [{"method": "flap", "budget": 0.2, "config": bench.config_of("flap")}]}
    other = {"settings": {"a": 1}, "command": "x", "rows": [
        {"method": "flap", "budget": 0.2, "config": bench.config_of("flap"), "mark": "dup"},
        {"method": "shortgpt", "budget": 0.2, "config": cfg},
        {"method": "osscar", "budget": 0.2, "config": {"peer": "osscar", "max_swaps": 12345}}]}
    assert bench.merge_rows(out, other) == [("shortgpt", 0.2)]
    assert [r["method"] for r in out["rows"]] == ["flap", "shortgpt"] and "mark" not in out["rows"][0]
    with pytest.raises(SystemExit, match="--merge"):
        bench.merge_rows(out, {"settings": {"a": 2}, "rows": []})


def test_merge_of_text_rows_adds_missing_texts_and_rows():
    bench = _bench()
    mine = {"settings": {"a": 1}, "texts": {"wiki": 1}, "unpruned": {"wiki": 1},
            "rows": [{"method": "flap", "budget": 0.2, "text": "wiki"}]}
    other = {"settings": {"a": 1}, "texts": {"wiki": 2, "captions": 3}, "unpruned": {"wiki": 2, "captions": 3},
             "rows": [{"method": "flap", "budget": 0.2, "text": "wiki"}, {"method": "flap", "budget": 0.3, "text": "wiki"}]}
    assert bench.merge_text_rows(mine, other) == [("flap", 0.3, "wiki")]
    assert mine["texts"] == {"wiki": 1, "captions": 3} and mine["unpruned"] == {"wiki": 1, "captions": 3}
    with pytest.raises(SystemExit, match="--merge"):
        bench.merge_text_rows(mine, {"settings": {}, "rows": []})


def test_merge_writes_into_the_output_given_and_leaves_the_committed_file(tmp_path, monkeypatch):
    bench = _bench()
    committed = tmp_path / "committed.json"
    committed.write_text(json.dumps({"settings": {"a": 1}, "rows": []}))
    monkeypatch.setattr(bench, "OUTPUT", committed)
    monkeypatch.setattr(bench, "summarise", lambda out: None)
    mine, other = tmp_path / "mine.json", tmp_path / "other.json"
    mine.write_text(json.dumps({"settings": {"a": 1}, "rows": []}))
    other.write_text(json.dumps({"settings": {"a": 1}, "command": "x", "rows": [
        {"method": "shortgpt", "budget": 0.3, "config": bench.config_of("shortgpt")}]}))
    before = committed.read_text()
    bench.main(["--merge", str(other), "--output", str(mine)])
    assert [(r["method"], r["budget"]) for r in json.loads(mine.read_text())["rows"]] == [("shortgpt", 0.3)]
    assert committed.read_text() == before
