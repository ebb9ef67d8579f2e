"""Every number README.md and REPRODUCTION.md quote is regenerated from committed results files (CI runs this)."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))
sys.path.insert(0, str(ROOT / "tests"))

import pytest  # noqa: E402
import quotes  # noqa: E402
import summarize  # noqa: E402

STALE = summarize.stale_runs(ROOT / "studies" / "results")
STALE_QUOTES: list[str] = []  # quotes reading benchmark files made before the current significance tests
summarize.check(stale=STALE_QUOTES)


def test_every_quoted_number_matches_the_committed_results():
    stale: list[str] = []
    assert summarize.check(stale=stale) == []
    n = sum(len(summarize.QUOTE.findall((ROOT / d).read_text())) for d in summarize.DOCS)
    assert n >= 100  # the docs really are marked up
    # what a stale file holds is not compared, it is listed: every such quote names a stale run or benchmark file
    assert all(any(f"studies/results/{name}:" in line for name, _, _ in STALE) or "benchmarks/results/" in line
               for line in stale)


def test_check_passes_on_the_committed_docs():
    assert not STALE and not STALE_QUOTES  # every committed study run carries today's significance tests
    out = subprocess.run([sys.executable, str(ROOT / "studies" / "summarize.py"), "--check"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all match" in out.stdout and "STALE" not in out.stdout


def test_stale_runs_are_listed_with_the_command_that_regenerates_them(tmp_path):
    import shutil

    run = next(p for p in sorted((ROOT / "studies" / "results").iterdir())
               if (p / "results.json").is_file() and "statistics" in json.loads((p / "results.json").read_text())
               .get("signature", {}))
    assert summarize.stale_runs(ROOT / "studies" / "results") == []
    shutil.copytree(run, tmp_path / run.name)
    res = json.loads((tmp_path / run.name / "results.json").read_text())
    res["signature"]["statistics"] = "0-old"  # significance from an older statistics module
    (tmp_path / run.name / "results.json").write_text(json.dumps(res))
    (name, why, command), = summarize.stale_runs(tmp_path)
    assert name == run.name and "0-old" in why and run.name in command


def test_a_tampered_number_or_table_fails_and_fix_restores_it(tmp_path):
    for doc in summarize.DOCS:
        (tmp_path / doc).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    readme = (tmp_path / "REPRODUCTION.md").read_text()
    marker = "<!--q:cd:enfr_cross_domain:r-->"
    value = readme.split(marker, 1)[1].split("<!--/q-->", 1)[0]
    assert value == f"{quotes.study('enfr_cross_domain')['pearson_r']:.2f}"  # independent read of the file
    tampered = readme.replace(f"{marker}{value}<!--/q-->", f"{marker}0.99<!--/q-->")
    base = "<!--q:base:enfr_ablation-->"
    held = readme.split(base, 1)[1].split("<!--/q-->", 1)[0]
    tampered = tampered.replace(f"{base}{held}<!--/q-->", f"{base}1.00<!--/q-->")
    (tmp_path / "REPRODUCTION.md").write_text(tampered)
    problems = summarize.check(root=tmp_path)
    assert len(problems) == 2
    assert any("'cd:enfr_cross_domain:r' says '0.99'" in p for p in problems)
    assert any("'base:enfr_ablation' says '1.00'" in p for p in problems)
    summarize.check(fix=True, root=tmp_path)
    assert (tmp_path / "REPRODUCTION.md").read_text() == readme and summarize.check(root=tmp_path) == []


def test_unknown_names_are_reported_not_skipped(tmp_path):
    for doc in summarize.DOCS:
        (tmp_path / doc).parent.mkdir(exist_ok=True)
        (tmp_path / doc).write_text("x <!--q:nosuch:thing-->1<!--/q--> y <!--q:base:no_such_run-->2<!--/q-->\n")
    problems = summarize.check(root=tmp_path)
    assert len(problems) == 2 * len(summarize.DOCS) and all("cannot be computed" in p for p in problems)


def test_significance_is_read_from_the_run_never_recomputed(tmp_path, monkeypatch):
    """A run made by today's statistics is quoted from its own columns; one made before raises Stale."""
    rows = [{"site": "a", "kept_head": 0, "delta": -0.02, "p_value": 0.004, "p_adjusted": 0.008, "significant": True,
             "ci_low": -0.03, "ci_high": -0.01, "test": "McNemar mid-p (paired correctness)"},
            {"site": "b", "kept_head": 1, "delta": 0.001, "p_value": 0.6, "p_adjusted": 0.6, "significant": False,
             "ci_low": -0.01, "ci_high": 0.012, "test": "McNemar mid-p (paired correctness)"}]
    signature = {"settings": {"alpha": 0.01, "correction": "holm"}, "statistics": quotes.statistics_version(), "n": 9}
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "results.json").write_text(json.dumps({"metric": "accuracy", "base": 0.9, "rows": rows,
                                                               "signature": signature}))
    old = {**signature}
    del old["statistics"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.json").write_text(json.dumps({"metric": "accuracy", "base": 0.9, "signature": old,
                                                               "rows": [{k: v for k, v in r.items() if k != "p_adjusted"}
                                                                        for r in rows]}))
    monkeypatch.setattr(quotes, "STUDIES", tmp_path)
    quotes.load.cache_clear()
    assert quotes.quote("abo:new:*:sig") == "1" and quotes.quote("abo:new:a:padj~p") == "0.008"
    assert quotes.quote("abo:new:b:p~p") == "0.600"  # the run's p as written, not doubled
    assert "| a | 0 | -2.00 | [-3.00, -1.00] | 0.004 | 0.008 | **yes** |" in quotes.block("abo:new")
    for name in ("abo:old:*:sig", "abo:old:a:p", "abl:old:all:sig"):
        with pytest.raises(quotes.Stale, match="studies/results/old: made before the current significance tests"):
            quotes.quote(name)
    assert quotes.quote("abo:old:a:delta~+.2f") == "-2.00"  # a score does not depend on the tests
    ablation = [{**r, "kind": "encoder", "head": i, "damage": -r["delta"]} for i, r in enumerate(rows)]
    ablation.append({**ablation[0], "head": 2, "ci_low": -0.05, "ci_high": 0.01})
    (tmp_path / "abl").mkdir()
    (tmp_path / "abl" / "results.json").write_text(json.dumps({"metric": "accuracy", "base": 0.9, "rows": ablation,
                                                               "signature": signature}))
    assert quotes.quote("abl:abl:all:halfwidth") == "1.10"  # median of 1.00, 1.10, 3.00 (x100)
    curve = {"metric": "accuracy", "base": 0.9, "rows": [], "signature": signature, "no_significant_loss": {
        "importance": {"share": 0.4, "first_loss": 0.5, "relative_low_at_share": 0.955, "alpha": 0.05}}}
    (tmp_path / "curve").mkdir()
    (tmp_path / "curve" / "results.json").write_text(json.dumps(curve))
    assert [quotes.quote(f"nsl:curve:importance:{k}") for k in ("share", "low", "first")] == ["40", "96", "50"]
    with pytest.raises(quotes.Stale, match="no adjusted p"):
        quotes.adjusted([{"p_value": 0.1}], "benchmarks/results/x.json")
    quotes.load.cache_clear()


@pytest.fixture(scope="module")
def fresh_ablation(tmp_path_factory):
    """A one-head ablation run made by today's code on a tiny GPT-2 (figures, CSVs, figures.json)."""
    import random

    import torch

    from headprune.evaluation import LanguageModelling
    from headprune.experiments.ablation import SweepSettings
    from headprune.experiments.rundir import RunOutput
    from headprune.experiments.study import run_ablation
    from tiny import build, word_tokenizer

    rng = random.Random(0)
    texts = [" ".join(rng.choice("a b c d e f g h i j".split()) for _ in range(40)) for _ in range(20)]
    model = build("gpt2")
    with torch.no_grad():  # larger weights: masking a head changes the perplexity
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    ev = LanguageModelling(word_tokenizer(texts), texts, block_size=16, batch_size=16)
    results = tmp_path_factory.mktemp("results")
    run_ablation(model, ev, RunOutput(results / "tiny_ablation", progress=False), settings=SweepSettings(alpha=0.2))
    return results


def test_a_fresh_run_is_not_stale_and_its_figures_match_its_table(fresh_ablation):
    run = fresh_ablation / "tiny_ablation"
    assert summarize.stale_runs(fresh_ablation) == []
    assert summarize.figure_problems(fresh_ablation) == []
    index = json.loads((run / "figures.json").read_text())
    assert set(index) == {"ablation_heatmap.png", "ablation_histogram.png"}
    with open(run / "ablation.csv", newline="") as f:
        starred = sorted(f"{r['site']}:{r['head']}" for r in csv.DictReader(f) if r["significant"] == "True")
    assert index["ablation_heatmap.png"]["starred"] == starred and starred  # some heads matter at alpha 0.2
    sha = hashlib.sha256((run / "ablation.csv").read_bytes()).hexdigest()
    assert index["ablation_heatmap.png"]["sha256"] == sha
    assert f"(drawn from ablation.csv, sha256 {sha[:12]})" in (run / "report.html").read_text()  # the report says so


def test_a_figure_not_drawn_from_the_current_table_is_reported(fresh_ablation, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(fresh_ablation, copy)
    run = copy / "tiny_ablation"
    table = (run / "ablation.csv").read_text()
    lines = table.splitlines()
    flipped = lines[1].rsplit(",", 1)
    lines[1] = flipped[0] + "," + ("False" if flipped[1] == "True" else "True")  # one head's verdict changed
    (run / "ablation.csv").write_text("\n".join(lines) + "\n")
    problems = summarize.figure_problems(copy)
    assert len(problems) == 2 and all("which the run no longer holds" in p for p in problems)
    index = json.loads((run / "figures.json").read_text())
    for entry in index.values():  # the same sha recorded, but the stars disagree with the table
        entry["sha256"] = hashlib.sha256((run / "ablation.csv").read_bytes()).hexdigest()
    (run / "figures.json").write_text(json.dumps(index))
    problems = summarize.figure_problems(copy)
    assert len(problems) == 1 and "ablation_heatmap.png: stars" in problems[0] and "significant" in problems[0]
    (run / "figures.json").unlink()
    assert len(summarize.figure_problems(copy)) == 2  # figures that record nothing are reported too


def test_the_family_table_is_checked_too(tmp_path):
    for doc in summarize.DOCS:
        (tmp_path / doc).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    text = (tmp_path / "docs" / "families.md").read_text()
    assert "| `mbart` | MBartForConditionalGeneration | exact |" in text
    (tmp_path / "docs" / "families.md").write_text(text.replace("| `mbart` | MBartForConditionalGeneration | exact |",
                                                     "| `mbart` | MBartForConditionalGeneration | refused |"))
    assert summarize.check(root=tmp_path) == ["docs/families.md: the model-family table differs from "
                                              "benchmarks/results/families.json"]
