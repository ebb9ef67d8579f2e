"""Every number README.md and REPRODUCTION.md quote is regenerated from committed results files (CI runs this)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))

import quotes  # noqa: E402
import summarize  # noqa: E402


def test_check_passes_on_the_committed_docs():
    out = subprocess.run([sys.executable, str(ROOT / "studies" / "summarize.py"), "--check"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all match" in out.stdout
    n = sum(len(summarize.QUOTE.findall((ROOT / d).read_text())) for d in summarize.DOCS)
    assert n >= 100  # the docs really are marked up


def test_a_tampered_number_or_table_fails_and_fix_restores_it(tmp_path):
    for doc in summarize.DOCS:
        (tmp_path / doc).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    readme = (tmp_path / "REPRODUCTION.md").read_text()
    marker = "<!--q:cd:enfr_cross_domain:r-->"
    value = readme.split(marker, 1)[1].split("<!--/q-->", 1)[0]
    assert value == f"{quotes.study('enfr_cross_domain')['pearson_r']:.2f}"  # independent read of the file
    tampered = readme.replace(f"{marker}{value}<!--/q-->", f"{marker}0.99<!--/q-->")
    tampered = tampered.replace("| decoder.2.cross | 1 | -17.29 |", "| decoder.2.cross | 1 | -7.29 |", 1)
    (tmp_path / "REPRODUCTION.md").write_text(tampered)
    problems = summarize.check(root=tmp_path)
    assert len(problems) == 2
    assert "'cd:enfr_cross_domain:r' says '0.99'" in problems[0] or "'cd:enfr_cross_domain:r' says '0.99'" in problems[1]
    assert any("block 'abo:enfr_all_but_one'" in p for p in problems)
    summarize.check(fix=True, root=tmp_path)
    assert (tmp_path / "REPRODUCTION.md").read_text() == readme and summarize.check(root=tmp_path) == []


def test_unknown_names_are_reported_not_skipped(tmp_path):
    for doc in summarize.DOCS:
        (tmp_path / doc).parent.mkdir(exist_ok=True)
        (tmp_path / doc).write_text("x <!--q:nosuch:thing-->1<!--/q--> y <!--q:base:no_such_run-->2<!--/q-->\n")
    problems = summarize.check(root=tmp_path)
    assert len(problems) == 2 * len(summarize.DOCS) and all("cannot be computed" in p for p in problems)


def test_holm_and_two_sided_derivation_of_committed_rows():
    rows = [{"p_value": 0.004, "test": "paired bootstrap (corpus BLEU)"},
            {"p_value": 0.03, "test": "paired t-test (per-example correctness)"},
            {"p_value": 0.6, "test": "paired bootstrap (corpus BLEU)"}]
    assert [quotes.two_sided(r) for r in rows] == [0.008, 0.03, 1.0]  # one-sided bootstrap doubled, t-test as is
    # Holm by hand: sorted 0.008*3 = 0.024, 0.03*2 = 0.06, 1.0*1 = 1.0
    assert quotes.holm_rows(rows) == [0.024, 0.06, 1.0]
    new = [{"p_value": 0.5, "p_adjusted": 0.7}, {"p_value": 0.1, "p_adjusted": 0.2}]
    assert quotes.holm_rows(new) == [0.7, 0.2]  # rows written by the current code: their own adjusted p


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
