"""Every bad value is a clear error, never a silent substitution (issue 13, item 4).

Each refusal: one line naming the flag, the value and what is allowed; exit code 2; nothing written.
Each is paired with its accepted neighbour, so a test fails if the check refuses too much.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from tiny import build, word_tokenizer

runner = CliRunner()
WORDS = "the a film was good bad very not quite an old new story plot actor scene long short".split()


def _refused(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _texts(n: int, length: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (length,), generator=g).tolist())
            for _ in range(n)]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A tiny BERT and RoBERTa classifier, a tiny GPT-2, 80 labelled examples (more than the 64 positions)."""
    root = tmp_path_factory.mktemp("bad")
    texts = _texts(80, 6)
    labels = [i % 3 for i in range(80)]
    (root / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in zip(texts, labels, strict=True)))
    (root / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 3}\n"
                                                                  for i, t in enumerate(_texts(20, 6, seed=1))))
    (root / "long.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n"
                                                                 for i, t in enumerate(_texts(4, 100, seed=2))))
    (root / "text.txt").write_text("\n".join(_texts(40, 30, seed=3)))
    tok = word_tokenizer(WORDS)
    hp.save_pruned(build("bert"), root / "bert", tokenizer=tok)
    hp.save_pruned(build("roberta"), root / "roberta", tokenizer=tok)
    hp.save_pruned(build("gpt2"), root / "gpt2", tokenizer=tok)
    return root


def _evaluate(root: Path, model: str, *extra: str, data: str = "dev.tsv") -> list[str]:
    task = "lm" if model == "gpt2" else "classification"
    return ["evaluate", str(root / model), "--task", task, "--data", str(root / data), "--json", *extra]


# ------------------------------------------------------------------------------ counts below 1


@pytest.mark.parametrize(("flag", "value", "allowed"), [
    ("--batch-size", "0", ">= 1"), ("--limit", "0", "positive"), ("--max-length", "0", ">= 2"),
    ("--max-length", "1", ">= 2"), ("--batch-size", "-3", ">= 1"), ("--beams", "0", ">= 1")])
def test_evaluate_refuses_a_count_below_its_minimum(root, flag, value, allowed):
    line = _refused(runner.invoke(app, _evaluate(root, "bert", flag, value)))
    assert f"{flag} {value}" in line and allowed in line


def test_batch_size_given_is_used_not_replaced(root):
    """--batch-size 1 scores what the default batch does (padding aside): the value is honoured, not swapped."""
    one = runner.invoke(app, _evaluate(root, "bert", "--batch-size", "1"))
    default = runner.invoke(app, _evaluate(root, "bert"))
    assert one.exit_code == 0 and default.exit_code == 0, one.output + default.output
    a, b = json.loads(one.stdout), json.loads(default.stdout)
    assert a["signature"]["batch_size"] == 1 and b["signature"]["batch_size"] == 32
    assert a["n"] == b["n"] == 80 and a["score"] == pytest.approx(b["score"], abs=1e-12)


@pytest.mark.parametrize(("command", "flag", "value"), [
    ("ablate", "--resamples", "0"), ("ablate", "--batch-size", "0"), ("ablate", "--limit", "0"),
    ("curve", "--seeds", "0"), ("curve", "--min-per-site", "-1"), ("curve", "--batch-size", "0"),
    ("all-but-one", "--calib-limit", "0"), ("compress", "--seq-len", "0"), ("compress", "--batch-size", "0"),
    ("compress", "--tgt-len", "0"), ("compress", "--calib-limit", "0")])
def test_study_and_compress_refuse_counts_below_one_and_write_nothing(root, tmp_path, command, flag, value):
    out = tmp_path / "out"
    args = [command, str(root / "bert"), "--task", "classification", "--data", str(root / "dev.tsv"),
            flag, value, "-o", str(out)]
    if command == "compress":
        args += ["--calib-data", str(root / "train.tsv"), "--share", "0.5", "--no-bench"]
    line = _refused(runner.invoke(app, args))
    assert f"{flag} {value}" in line and ("allowed" in line or "must be a positive int" in line), line
    assert not out.exists()


# ------------------------------------------------------------------- lengths beyond the positions


def _forward(model_dir: Path, length: int):
    model = hp.load_pruned(model_dir)
    ids = torch.full((1, length), 5)
    return model(input_ids=ids, attention_mask=torch.ones_like(ids))


@pytest.mark.parametrize(("model", "positions"), [("bert", 64), ("roberta", 69)])
def test_max_length_beyond_the_positions_is_refused_at_the_models_own_limit(root, model, positions):
    """The limit is the model's own: a forward of ``positions`` tokens runs, one more fails (RoBERTa's table
    starts after the padding index: 70 rows, 69 positions); --max-length follows exactly that line."""
    _forward(root / model, positions)
    with pytest.raises((IndexError, RuntimeError)):
        _forward(root / model, positions + 1)
    ok = runner.invoke(app, _evaluate(root, model, "--max-length", str(positions), data="long.tsv"))
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["n"] == 4
    line = _refused(runner.invoke(app, _evaluate(root, model, "--max-length", str(positions + 1), data="long.tsv")))
    assert f"--max-length {positions + 1}" in line and f"2..{positions}" in line


def test_lm_block_size_beyond_the_positions_is_refused(root):
    _forward(root / "gpt2", 64)
    with pytest.raises((IndexError, RuntimeError)):
        _forward(root / "gpt2", 65)
    ok = runner.invoke(app, _evaluate(root, "gpt2", "--block-size", "64"))
    assert ok.exit_code == 0, ok.output
    line = _refused(runner.invoke(app, _evaluate(root, "gpt2", "--block-size", "65")))
    assert "--block-size 65" in line and "2..64" in line


# ---------------------------------------------------------------------------- --drop / --heads JSON


def test_missing_heads_file_is_called_missing_not_invalid_json(root, tmp_path):
    for flag in ("--drop",):
        out = tmp_path / "pruned"
        line = _refused(runner.invoke(app, ["prune", str(root / "bert"), flag, str(tmp_path / "nope.json"),
                                            "-o", str(out)]))
        assert "no such file" in line and "nope.json" in line and "not valid JSON" not in line
        assert not out.exists()


def test_duplicate_site_in_heads_json_is_refused(root, tmp_path):
    out = tmp_path / "pruned"
    twice = '{"encoder.0.self": [0], "encoder.0.self": [1]}'
    (tmp_path / "twice.json").write_text(twice)
    for value in (twice, str(tmp_path / "twice.json")):
        line = _refused(runner.invoke(app, ["prune", str(root / "bert"), "--drop", value, "-o", str(out)]))
        assert "'encoder.0.self' given twice" in line and "--drop" in line
        assert not out.exists()
    line = _refused(runner.invoke(app, _evaluate(root, "bert", "--heads-off", twice)))
    assert "given twice" in line and "--heads-off" in line
    # the same heads as one list are accepted, and remove both heads
    ok = runner.invoke(app, ["prune", str(root / "bert"), "--drop", '{"encoder.0.self": [0, 1]}', "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert hp.load_pruned(out).config.num_attention_heads == 4  # config keeps the family's count
    q = hp.load_pruned(out).bert.encoder.layer[0].attention.self.query
    assert q.out_features == 2 * 8  # 4 heads of 8 dims, two removed


def test_malformed_heads_json_is_one_line(root, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{encoder: [0]")
    line = _refused(runner.invoke(app, ["prune", str(root / "bert"), "--drop", str(bad), "-o", str(tmp_path / "o")]))
    assert "not valid JSON" in line and "bad.json" in line


# --------------------------------------------------------------- compress evaluates every example


def test_compress_without_seq_len_evaluates_every_example(root, tmp_path):
    """80 examples, a 64-position model: the default --seq-len (min(128, positions)) must not cap the data."""
    out = tmp_path / "c"
    result = runner.invoke(app, ["compress", str(root / "bert"), "--task", "classification", "--data",
                                 str(root / "dev.tsv"), "--calib-data", str(root / "train.tsv"), "--share", "0.5",
                                 "--scores", "ih", "--no-bench", "-o", str(out)])
    assert result.exit_code == 0, result.output
    record = json.loads((out / "compress.json").read_text())
    assert record["settings"]["seq_len"] == 64
    assert record["evaluation"]["before"]["n"] == 80 and record["signature"]["n"] == 80
    full = json.loads(runner.invoke(app, _evaluate(root, "bert")).stdout)
    assert record["evaluation"]["before"]["score"] == pytest.approx(full["score"], abs=1e-12)


# ------------------------------------------------------------------------- malformed results.json


@pytest.mark.parametrize("text", ["{\"title\": \"cut", "[1, 2]", "\xff\xfe", '{"headline": 5}',
                                  '{"headline": [["only a label"]]}', '{"figures": [{"caption": "no file"}]}'])
def test_malformed_results_json_is_one_line(tmp_path, text):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_bytes(text.encode("latin-1"))
    line = _refused(runner.invoke(app, ["report", str(run)]))
    assert "results.json" in line and "allowed" in line
    assert not (run / "report.html").exists()


def test_train_classifier_max_length_beyond_the_positions_is_refused(root, tmp_path):
    out = tmp_path / "cls"
    line = _refused(runner.invoke(app, ["train", "classifier", str(root / "bert"), "--data", str(root / "train.tsv"),
                                        "--max-length", "65", "-o", str(out)]))
    assert "--max-length 65" in line and "2..64" in line and not out.exists()
