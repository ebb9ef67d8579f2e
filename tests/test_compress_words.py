"""``headprune compress`` speaks the library's words: one flag per PruneSettings field (the flags removed in
0.3.0 are unknown options); bad budgets are refused in one line before the model is loaded (or, for a count,
before any data is read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from tiny import build, word_tokenizer

runner = CliRunner()
WORDS = "the a film movie good bad dull fine great awful long short".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A tiny BERT classifier (2 sites x 4 heads) and two disjoint TSVs."""
    root = tmp_path_factory.mktemp("words")
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(4 + i % 3)) for i in range(16)]
    for name, part in (("dev.tsv", texts[:8]), ("train.tsv", texts[8:])):
        (root / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 3}\n" for i, t in enumerate(part)))
    hp.save_pruned(build("bert"), root / "bert", tokenizer=word_tokenizer(texts))
    return root / "bert", root / "dev.tsv", root / "train.tsv"


def _run(model: Path, dev: Path, train: Path, out: Path, *args: str):
    return runner.invoke(app, ["compress", str(model), "--task", "classification", "--data", str(dev),
                               "--calib-data", str(train), "--no-bench", "-o", str(out), *args])


def _one_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("args, words", [
    (["--share", "0"], ["--share 0", "(0, 1]"]),
    (["--n-keep", "0"], ["--n-keep 0", ">= 1"]),
    (["--share", "1.5"], ["--share 1.5", "0.0..1.0"]),
    (["--share", "0.5", "--n-keep", "3"], ["exactly one budget", "--share", "--n-keep"]),
    (["--share", "0.5", "--scores", "ih", "--compensate", "tune"], ["--compensate 'tune' with --scores 'ih'"]),
    (["--units", "both", "--n-keep", "3"], ["--n-keep 3 with --units 'both'"]),
    (["--share", "0.5", "--price", "count", "--val-data", "x.tsv"], ["--val-data with --compensate tune"]),
])
def test_bad_budgets_are_refused_before_the_model_is_loaded(tmp_path, args, words):
    """The model directory does not exist: the refusal names the budget, not the model."""
    out = tmp_path / "out"
    line = _one_line(_run(tmp_path / "no-model", tmp_path / "dev.tsv", tmp_path / "train.tsv", out, *args))
    assert all(w in line for w in words), line
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--n-keep"])
def test_a_count_above_the_heads_is_refused_before_any_data_is_read(tiny, tmp_path, flag):
    model, _, _ = tiny
    out = tmp_path / "out"
    missing = tmp_path / "never-read.tsv"  # data is read after the check: a missing file would be named
    missing.write_text("not a table at all")
    line = _one_line(_run(model, missing, missing, out, flag, "500", "--allow-same-data"))
    assert f"{flag} 500; allowed: an integer 1..8" in line, line
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--keep", "--keep-heads", "--flops", "--kv", "--method", "--tune-target",
                                  "--trust-unverified"])
def test_the_flags_removed_in_0_3_are_unknown_options(tmp_path, flag):
    out = tmp_path / "out"
    args = [flag] if flag == "--trust-unverified" else [flag, "0.5"]
    result = _run(tmp_path / "no-model", tmp_path / "dev.tsv", tmp_path / "train.tsv", out, "--share", "0.5", *args)
    assert result.exit_code == 2 and f"No such option: {flag}" in result.output, result.output
    assert not out.exists()


def test_the_run_records_the_settings_it_was_given(tiny, tmp_path):
    model, dev, train = tiny
    run = _run(model, dev, train, tmp_path / "run", "--share", "0.5", "--price", "count", "--scores", "ih",
               "--compensate", "none", "--no-verify")
    assert run.exit_code == 0, run.output
    assert "deprecated" not in run.stderr
    record = json.loads((tmp_path / "run" / "compress.json").read_text())
    assert sum(len(v) for v in record["dropped_heads"].values()) == 4  # half of 2 x 4 heads
    assert {k: record["settings"][k] for k in ("share", "price", "scores", "compensate")} == \
        {"share": 0.5, "price": "count", "scores": "ih", "compensate": []}
