"""``headprune compress --units neurons|both``: end to end on a tiny saved BERT, and bad input refused in one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.core.model.ffn import find_ffns
from tiny import build, word_tokenizer

runner = CliRunner()
TEXTS = ["a good film", "a bad film", "the plot was thin", "wonderful acting", "dull and long", "loved it",
         "no", "a charming journey", "bleak and desperate", "fine fine fine", "not good at all"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("units")
    model = build("bert")
    model.config.id2label, model.config.label2id = {0: "0", 1: "1", 2: "2"}, {"0": 0, "1": 1, "2": 2}
    hp.save_pruned(model, root / "model", tokenizer=word_tokenizer(TEXTS))
    for name, rows in (("dev.tsv", TEXTS), ("train.tsv", TEXTS[::-1] * 2), ("val.tsv", TEXTS[2:])):
        lines = ["sentence\tlabel"] + [f"{t}\t{i % 2}" for i, t in enumerate(rows)]
        (root / name).write_text("\n".join(lines) + "\n")
    return root


def _cli(saved, out, *extra):
    return runner.invoke(app, ["compress", str(saved / "model"), "--task", "classification", "--data",
                               str(saved / "dev.tsv"), "--calib-data", str(saved / "train.tsv"), "--seq-len", "8",
                               "--batch-size", "4", *extra, "-o", str(out)])


def test_cli_units_both_end_to_end(saved, tmp_path):
    out = tmp_path / "out"
    result = _cli(saved, out, "--units", "both", "--share", "0.5", "--val-data", str(saved / "val.tsv"),
                  "--bench-batch", "2", "--bench-repeats", "1")
    assert result.exit_code == 0, result.output
    record = json.loads((out / "compress.json").read_text())
    assert "stages: select kept, remove kept, reconstruct" in result.output
    assert record["split"]["val_examples"] == len(TEXTS) - 2 and record["split"]["calib_examples"] == 2 * len(TEXTS)
    model = hp.load_pruned(out)
    assert sum(f.width for f in find_ffns(model)) == record["sizes"]["after"]["neurons"] < 74
    assert record["sizes"]["after"]["flops"] < record["sizes"]["before"]["flops"]
    assert (out / "kept_units.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the report has its figure
    assert "data:image/png;base64," in (out / "report.html").read_text()
    ev = runner.invoke(app, ["evaluate", str(out), "--task", "classification", "--data", str(saved / "dev.tsv"),
                             "--json"])
    assert json.loads(ev.stdout)["score"] == pytest.approx(record["evaluation"]["after"]["score"])


def _units_run(saved, tmp_path, *extra):
    """(CLI result, compress.json) of a --units both run validated on val.tsv."""
    out = tmp_path / "out"
    result = _cli(saved, out, "--units", "both", "--share", "0.5", "--val-data", str(saved / "val.tsv"), "--no-bench",
                  *extra)
    assert result.exit_code == 0, result.output
    return result, json.loads((out / "compress.json").read_text())


def test_cli_fit_limit_fits_on_more_calibration_examples_than_the_scores(saved, tmp_path):
    _, record = _units_run(saved, tmp_path, "--calib-limit", "4", "--fit-limit", "12")
    assert record["split"]["calib_examples"] == 4 and record["split"]["fit_examples"] == 12
    assert record["signature"]["fit_limit"] == 12


def test_cli_distill_runs_after_the_reconstruction_and_the_summary_says_if_it_was_kept(saved, tmp_path):
    result, record = _units_run(saved, tmp_path, "--distill-epochs", "2", "--distill-lr", "1e-4")
    assert record["settings"]["compensate"] == ["reconstruct", {"name": "distill", "epochs": 2, "lr": 1e-4}]
    assert record["distillation"]["steps"] >= 2
    stage = record["stages"]["distill"]
    assert f"distill {stage}" in result.output
    assert stage.startswith("kept") == (record["losses"]["distilled"] <= min(
        record["losses"]["pruned"], record["losses"].get("reconstructed", float("inf"))))


@pytest.mark.parametrize("args, message", [
    (["--units", "layers", "--share", "0.5"], "--units 'layers'; allowed"),
    (["--units", "both", "--n-keep", "3"], "--n-keep 3 with --units 'both'"),
    (["--units", "both", "--share", "0.5", "--price", "count"], "--price 'count' with --units 'both'"),
    (["--units", "both", "--share", "0.5", "--scores", "ih"], "--scores 'ih' with --units 'both'"),
    (["--units", "neurons", "--share", "0.5", "--val-data", "DEV"], "--val-data"),
    (["--units", "neurons", "--share", "0.5", "--price", "bytes"], "--price 'bytes'; allowed"),
    (["--units", "both", "--share", "0.5", "--fit-limit", "8"], "--fit-limit 8 without --val-data"),
    (["--units", "both", "--share", "0.5", "--fit-limit", "0", "--val-data", "VAL"], "--fit-limit 0; allowed"),
    (["--units", "both", "--share", "0.5", "--fit-limit", "8", "--val-data", "VAL", "--compensate", "none"],
     "--fit-limit with --compensate none"),
    (["--units", "both", "--share", "0.5", "--distill-epochs", "-1"], "--distill-epochs"),
    (["--units", "both", "--share", "0.5", "--distill-epochs", "1", "--distill-lr", "0"], "--distill-lr 0.0; allowed"),
])
def test_cli_units_bad_input_exits_2_one_line_nothing_written(saved, tmp_path, args, message):
    args = [{"DEV": str(saved / "dev.tsv"), "VAL": str(saved / "val.tsv")}.get(a, a) for a in args]
    out = tmp_path / "never"
    result = _cli(saved, out, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output and not out.exists()


def test_heads_only_compress_says_which_stages_the_guard_kept(saved, tmp_path):
    out = tmp_path / "heads"
    result = _cli(saved, out, "--share", "0.5", "--price", "count", "--compensate", "tune", "--no-bench")
    assert result.exit_code == 0, result.output
    record = json.loads((out / "compress.json").read_text())
    line = next(x for x in result.output.splitlines() if x.startswith("stages"))
    assert record["losses"]
    for stage, note in record["stages"].items():
        assert f"{stage} {note}" in line


def test_heads_only_with_reconstruction_keeps_every_neuron(saved, tmp_path):
    out = tmp_path / "recon"
    result = _cli(saved, out, "--share", "0.5", "--compensate", "reconstruct", "--no-bench")
    assert result.exit_code == 0, result.output
    record = json.loads((out / "compress.json").read_text())
    assert record["sizes"]["after"]["neurons"] == record["sizes"]["before"]["neurons"] == 74
    assert record["sizes"]["after"]["heads"] < 8 and "reconstruct" in record["stages"]
    assert record["split"]["val_batches"] >= 1  # held out of the calibration batches
