"""Data as users hold it (issue 17, item 4): ``--split`` of a ``datasets`` directory on every command that
reads data, ``--label-map`` for string labels (or the model's own label names), refusals that name the
unmapped label and the CLI's flag, exit 2 and nothing written; and ``demo --fresh``, which the demo's
own message asks for."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import transformers as T
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.cli.dataflags import cli_terms, parse_label_map
from headprune.errors import ConfigError
from tiny import word_tokenizer

datasets = pytest.importorskip("datasets")  # the study extra; machines without it skip this file

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the film plot cast was good great fine bad dull poor and very too long funny".split()
runner = CliRunner()


def _rows(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))), rng.randrange(2)) for _ in range(n)]


TRAIN, VALID = _rows(12, 1), _rows(7, 2)
NAMES = ("negative", "positive")  # the model's id2label


def _tsv(path: Path, rows, labels=lambda y: str(y)) -> Path:
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{labels(y)}\n" for t, y in rows))
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A tiny 2-label BERT classifier (id2label negative/positive), a datasets directory with train and
    validation splits whose labels are strings, and the same rows as TSV files."""
    root = tmp_path_factory.mktemp("held")
    tok = word_tokenizer([t for t, _ in TRAIN + VALID])
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=37, max_position_embeddings=64, pad_token_id=0,
                          id2label=dict(enumerate(NAMES)))
    hp.save_pruned(T.BertForSequenceClassification(config).eval(), root / "cls", tokenizer=tok)
    short = {0: "neg", 1: "pos"}
    splits = {name: datasets.Dataset.from_dict({"sentence": [t for t, _ in rows],
                                                "label": [short[y] for _, y in rows]})
              for name, rows in (("train", TRAIN), ("validation", VALID))}
    datasets.DatasetDict(splits).save_to_disk(str(root / "dsdir"))
    _tsv(root / "valid.tsv", VALID)  # the reference: integer labels, read from a plain file
    _tsv(root / "valid_short.tsv", VALID, lambda y: short[y])
    _tsv(root / "valid_names.tsv", VALID, lambda y: NAMES[y].upper() if y else NAMES[y])
    meh = _tsv(root / "valid_meh.tsv", VALID[:-1], lambda y: short[y])  # then one row labelled 'meh' (row 6)
    meh.write_text(meh.read_text() + "the plot was fine\tmeh\n")
    return root


def _evaluate(root: Path, *args) -> dict:
    result = runner.invoke(app, ["evaluate", str(root / "cls"), "--task", "classification", "--json",
                                 *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _refused(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ------------------------------------------------------------------------------------------- --split


def test_split_is_chosen_and_equals_the_same_rows_read_from_a_file(root):
    reference = _evaluate(root, "--data", root / "valid.tsv")
    chosen = _evaluate(root, "--data", root / "dsdir", "--split", "validation", "--label-map", "neg=0,pos=1")
    assert chosen["n"] == reference["n"] == len(VALID)
    assert chosen["score"] == reference["score"]
    assert chosen["signature"]["split"] == "validation"
    assert _evaluate(root, "--data", root / "dsdir", "--split", "train", "--label-map", "neg=0,pos=1")["n"] == 12
    line = _refused(runner.invoke(app, ["evaluate", str(root / "cls"), "--task", "classification",
                                        "--data", str(root / "dsdir")]))
    assert "holds several splits (train, validation); pass --split with one of them" in line


def _command(root: Path, out: Path, command: str) -> list[str]:
    data = ["--task", "classification", "--data", str(root / "dsdir")]
    return {
        "evaluate": ["evaluate", str(root / "cls"), *data],
        "ablate": ["ablate", str(root / "cls"), *data, "-o", str(out)],
        "all-but-one": ["all-but-one", str(root / "cls"), *data, "-o", str(out)],
        "cross-domain": ["cross-domain", str(root / "cls"), *data, "--data-b", str(root / "dsdir"), "-o", str(out)],
        "curve": ["curve", str(root / "cls"), *data, "-o", str(out)],
        "dynamics": ["dynamics", str(root / "cls"), *data, "-o", str(out)],
        "compress": ["compress", str(root / "cls"), *data, "--share", "0.5", "-o", str(out)],
        "train classifier": ["train", "classifier", str(root / "cls"), "--data", str(root / "dsdir"), "-o", str(out)],
        "train translation": ["train", "translation", "--data", str(root / "dsdir"), "-o", str(out)],
    }[command]


SPLIT_FLAGS = [  # (command, the flag under test, the other splits the command needs to get that far)
    ("evaluate", "--split", []), ("ablate", "--split", []), ("all-but-one", "--split", []),
    ("all-but-one", "--choose-split", ["--split", "validation"]), ("cross-domain", "--split", []),
    ("cross-domain", "--split-b", ["--split", "validation"]), ("curve", "--split", []),
    ("curve", "--calib-split", ["--split", "validation"]), ("dynamics", "--split", []),
    ("compress", "--split", ["--calib-split", "train"]), ("compress", "--calib-split", ["--split", "validation"]),
    ("train classifier", "--split", []), ("train classifier", "--eval-split", ["--split", "train"]),
    ("train translation", "--split", []), ("train translation", "--eval-split", ["--split", "train"]),
]


@pytest.mark.parametrize("command, flag, before", SPLIT_FLAGS, ids=[f"{c} {f}" for c, f, _ in SPLIT_FLAGS])
def test_every_command_that_reads_data_reads_its_split(root, tmp_path, command, flag, before):
    """A split that is not there is refused by the flag that named it, listing the splits present, exit 2,
    nothing written: the flag reaches the loader of its own data set."""
    out = tmp_path / "out"
    args = _command(root, out, command) + before + [flag, "nope"] + ["--label-map", "neg=0,pos=1"] * (
        not command.startswith("train translation") and command != "train classifier")
    if flag == "--eval-split":
        args += ["--eval-data", str(root / "dsdir")]
    line = _refused(runner.invoke(app, args))
    assert f"{flag} 'nope' is not in '{root / 'dsdir'}'; splits present: train, validation" in line, line
    assert "split=" not in line
    assert not out.exists()


def test_study_runs_record_the_split_they_read(root, tmp_path):
    base = ["--task", "classification", "--data", str(root / "dsdir"), "--split", "validation",
            "--label-map", "neg=0,pos=1"]
    result = runner.invoke(app, ["ablate", str(root / "cls"), *base, "-o", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    signature = json.loads((tmp_path / "a" / "results.json").read_text())["signature"]
    assert signature["data_split"] == "validation" and signature["n"] == len(VALID)
    result = runner.invoke(app, ["curve", str(root / "cls"), *base, "--calib-split", "train", "--orders", "importance",
                                 "--step", "0.5", "-o", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    signature = json.loads((tmp_path / "c" / "results.json").read_text())["signature"]
    assert (signature["importance_split"], signature["importance_n"], signature["n"]) == ("train", 12, len(VALID))


# --------------------------------------------------------------------------------------- --label-map


def test_label_map_applied_by_id_and_by_the_models_label_names(root):
    reference = _evaluate(root, "--data", root / "valid.tsv")["score"]
    short = root / "valid_short.tsv"
    assert _evaluate(root, "--data", short, "--label-map", "neg=0,pos=1")["score"] == reference
    assert _evaluate(root, "--data", short, "--label-map", "neg=negative,pos=POSITIVE")["score"] == reference
    swapped = _evaluate(root, "--data", short, "--label-map", "neg=1,pos=0")
    assert swapped["score"] == pytest.approx(1 - reference, abs=1e-12)  # two classes: every verdict flips
    assert swapped["signature"]["label_map"] == {"neg": 1, "pos": 0}
    # labels that are the model's own names (config.id2label), in any case, need no map
    assert _evaluate(root, "--data", root / "valid_names.tsv")["score"] == reference


def test_labels_the_model_does_not_know_are_refused_naming_them_and_the_flag(root):
    line = _refused(runner.invoke(app, ["evaluate", str(root / "cls"), "--task", "classification",
                                        "--data", str(root / "valid_short.tsv")]))
    assert "unknown labels 'neg'" in line and "'pos'" in line and "--label-map LABEL=ID" in line
    assert "['negative', 'positive']" in line and "label2id" not in line


@pytest.mark.parametrize("command", ["ablate", "train classifier"])
def test_unmapped_label_refused_exit_2_nothing_written(root, tmp_path, command):
    out = tmp_path / "out"
    data = str(root / "valid_meh.tsv")
    if command == "ablate":
        args = ["ablate", str(root / "cls"), "--task", "classification", "--data", data]
    else:
        args = ["train", "classifier", str(root / "cls"), "--data", data]
    line = _refused(runner.invoke(app, [*args, "--label-map", "neg=0,pos=1", "-o", str(out)]))
    assert "unknown label 'meh' at row 6 (1 row)" in line and "--label-map" in line
    assert "'neg'" not in line.split("allowed")[0]  # only the unmapped label is named as unknown
    assert not out.exists()


@pytest.mark.parametrize("value, message", [
    ("neg", "'neg' is not LABEL=ID"),
    ("neg=0,pos=2", "'pos' maps to id 2, but the model has num_labels=2"),
    ("neg=0,pos=happy", "ID 'happy' of 'pos' is not an integer id or one of the model's labels"),
    ("neg=0,NEG=1", "'NEG' maps to both 0 and 1"),
])
def test_bad_label_maps_refused_before_reading_data(root, value, message):
    line = _refused(runner.invoke(app, ["evaluate", str(root / "cls"), "--task", "classification",
                                        "--data", str(root / "missing.tsv"), "--label-map", value]))
    assert f"--label-map {value!r}" in line and message in line


def test_label_map_parsing_by_itself():
    config = T.BertConfig(id2label={0: "negative", 1: "positive"})
    assert parse_label_map(" neg = 0 , pos=Positive ", config) == {"neg": 0, "pos": 1}
    assert parse_label_map("a=b=1") == {"a=b": 1}  # the last '=' separates
    assert parse_label_map(None) is None
    with pytest.raises(ConfigError, match="is not an integer id$"):
        parse_label_map("neg=negative")  # names need the model's config


def test_label_map_does_not_apply_to_lm(tmp_path):
    from tiny import build

    hp.save_pruned(build("gpt2"), tmp_path / "gpt2", tokenizer=word_tokenizer(["a b c"]))
    line = _refused(runner.invoke(app, ["evaluate", str(tmp_path / "gpt2"), "--task", "lm", "--data",
                                        "builtin:pydoc", "--label-map", "a=0"]))
    assert "--label-map does not apply to --task lm" in line


def test_train_classifier_reads_splits_and_takes_its_ids_from_the_label_map(root, tmp_path):
    """pos=0,neg=1 is the reverse of the default (sorted) order, so the new classifier's id2label shows the map
    was used; the evaluation split is scored after the epoch."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    encoder = tmp_path / "encoder"
    T.BertTokenizer(vocab={w: i for i, w in enumerate(words)}).save_pretrained(encoder)
    torch.manual_seed(0)
    T.BertModel(T.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=37, max_position_embeddings=64)).save_pretrained(encoder)
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "classifier", str(encoder), "--data", str(root / "dsdir"), "--split", "train",
                                 "--eval-data", str(root / "dsdir"), "--eval-split", "validation", "--label-map",
                                 "pos=0,neg=1", "--epochs", "1", "--max-length", "16", "--threads", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["id2label"] == {"0": "pos", "1": "neg"}
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["eval_n"] == len(VALID)
    line = _refused(runner.invoke(app, ["train", "classifier", str(encoder), "--data", str(root / "dsdir"), "--split",
                                        "train", "--label-map", "pos=0,neg=2", "-o", str(tmp_path / "gap")]))
    assert "leaves out ids [1]" in line and not (tmp_path / "gap").exists()


# ----------------------------------------------------------------------------------- errors in CLI terms


@pytest.mark.parametrize("args, expected, library", [
    (["--data", "{root}/valid.tsv", "--text-column", "review"], "--text-column 'review': no such column in",
     "text_column"),
    (["--data", "{root}/nocol.tsv"], "pass --text-column (and --text-pair-column) with one of them", "text_column"),
    (["--data", "{root}/valid.tsv", "--split", "train"], "--split 'train' only applies to a datasets directory",
     "split="),
])
def test_data_errors_name_the_cli_flag_not_the_library_argument(root, args, expected, library):
    (root / "nocol.tsv").write_text("words\tlabel\na b\t0\n")
    line = _refused(runner.invoke(app, ["evaluate", str(root / "cls"), "--task", "classification",
                                        *[a.replace("{root}", str(root)) for a in args]]))
    assert expected in line and library not in line


def test_translation_data_errors_name_the_cli_flags(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    line = _refused(runner.invoke(app, ["train", "translation", "--data", str(tmp_path / "a.txt"), "--data2",
                                        str(tmp_path / "a.txt"), "--source-column", "0", "-o", str(tmp_path / "o")]))
    assert "--source-column and --target-column apply to one table file; with --data2 give neither" in line


def test_cli_terms_translate_per_data_set():
    assert cli_terms("split='x' is not in 'd'; splits present: a", "--calib-data") == (
        "--calib-split 'x' is not in 'd'; splits present: a")
    assert cli_terms("'d' holds several splits (a, b); pass split= with one of them", "--data-b") == (
        "'d' holds several splits (a, b); pass --split-b with one of them")
    assert cli_terms("limit=0 must be a positive int (number of examples) or None for all", "--choose-data") == (
        "--calib-limit 0 must be a positive int (number of examples) or left out for all")
    assert cli_terms("config_or_label2id=dict must be", "--data") == "config_or_label2id=dict must be"


def test_datasets_is_in_the_study_extra():
    study = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("study ="))
    assert '"datasets>=' in study


# --------------------------------------------------------------------------------------------- demo


def test_demo_accepts_the_fresh_its_message_asks_for(tmp_path, monkeypatch):
    assert "--fresh" in runner.invoke(app, ["demo", "--help"], terminal_width=200).output
    out = tmp_path / "demo"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"signature": {"model": "another run"}}))
    line = _refused(runner.invoke(app, ["demo", "--quick", "-o", str(out)]))
    assert "pass --fresh to start over" in line
    seen = {}
    monkeypatch.setattr("headprune.experiments.demo.run_demo", lambda output, **kw: seen.update(kw) or output)
    result = runner.invoke(app, ["demo", "--quick", "--fresh", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert seen == {"mode": "quick", "fresh": True, "progress": True}
