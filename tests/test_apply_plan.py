"""``plan.json`` and ``headprune apply``: the plan a compress run stores (plan.json + plan.safetensors) rebuilds its
pruned model bit for bit on the model it was made on, whatever its stages rewrote; another model, or a file that is
not a plan, is refused in one line with nothing written."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.compression.replay import FORMAT
from tiny import build, word_tokenizer

runner = CliRunner()
TEXTS = ["a good film", "a bad film", "the plot was thin", "wonderful acting", "dull and long", "loved it",
         "not my kind of story", "a fine cast", "it drags", "sharp and funny"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("apply")
    model = build("bert")
    model.config.id2label, model.config.label2id = {0: "0", 1: "1", 2: "2"}, {"0": 0, "1": 1, "2": 2}
    hp.save_pruned(model, root / "model", tokenizer=word_tokenizer(TEXTS))
    for name, rows in (("dev.tsv", TEXTS), ("train.tsv", TEXTS[::-1] * 2)):
        (root / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(rows)))
    return root


def _compress(saved, out, *args, seq_len=("--seq-len", "8")):
    result = runner.invoke(app, ["compress", str(saved / "model"), "--task", "classification", "--data",
                                 str(saved / "dev.tsv"), "--calib-data", str(saved / "train.tsv"), *seq_len,
                                 "--batch-size", "4", "--no-bench", *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads((out / "plan.json").read_text())


def _same_bits(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("args, rewritten", [
    (["--share", "0.5", "--price", "count", "--compensate", "tune", "--no-guard"], "attention.output.dense.weight"),
    (["--units", "both", "--share", "0.5", "--scores", "fluctuation", "--compensate", "bias"], "output.dense.bias"),
    (["--units", "both", "--share", "0.5", "--compensate", "reconstruct", "--no-guard"], "output.dense.weight"),
    (["--units", "both", "--share", "0.5", "--compensate", "linear", "--no-guard"], "output.dense.weight"),
    (["--units", "both", "--share", "0.5", "--distill-epochs", "1", "--no-guard"], "embeddings.word_embeddings.weight"),
])
def test_apply_rebuilds_the_compressed_model_bit_for_bit(saved, tmp_path, args, rewritten):
    plan = _compress(saved, tmp_path / "run", *args)
    assert any(plan["dropped_heads"].values()) and any(k.endswith(rewritten) for k in plan["tensors"])
    assert (tmp_path / "run" / "plan.safetensors").is_file()
    result = runner.invoke(app, ["apply", str(saved / "model"), str(tmp_path / "run" / "plan.json"), "-o",
                                 str(tmp_path / "replay")])
    assert result.exit_code == 0, result.output
    _same_bits(hp.load_pruned(tmp_path / "run"), hp.load_pruned(tmp_path / "replay"))


def test_another_model_is_refused_by_its_fingerprint_with_nothing_written(saved, tmp_path):
    _compress(saved, tmp_path / "run", "--units", "both", "--share", "0.5", "--compensate", "reconstruct",
              "--no-guard")
    other = hp.load_model(saved / "model")
    with torch.no_grad():
        other.bert.encoder.layer[0].intermediate.dense.weight[0, 0] += 1.0  # one weight changed, same config
    hp.save_pruned(other, tmp_path / "other", tokenizer=word_tokenizer(TEXTS))
    result = runner.invoke(app, ["apply", str(tmp_path / "other"), str(tmp_path / "run" / "plan.json"), "-o",
                                 str(tmp_path / "replay")])
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and len(lines) == 1, result.output
    assert "fingerprint mismatch" in lines[0] and "encoder.layer.0.intermediate.dense.weight" in lines[0]
    assert not (tmp_path / "replay").exists()


def test_a_file_that_is_not_a_plan_is_refused_before_the_model_is_read(tmp_path):
    (tmp_path / "x.json").write_text('{"dropped": {}}')
    result = runner.invoke(app, ["apply", str(tmp_path / "no-model"), str(tmp_path / "x.json"), "-o",
                                 str(tmp_path / "out")])
    assert result.exit_code == 2 and FORMAT in result.output and not (tmp_path / "out").exists()


def test_a_run_repeats_from_its_compress_toml(saved, tmp_path):
    """--config RUN/compress.toml gives the same settings and the same plan as the flags that made RUN."""
    first = _compress(saved, tmp_path / "first", "--units", "both", "--share", "0.6", "--scores", "fluctuation",
                      "--compensate", "bias")
    toml = (tmp_path / "first" / "compress.toml").read_text()
    assert "[settings]" in toml and 'compensate = ["bias"]' in toml and "share = 0.6" in toml and "seq_len = 8" in toml
    again = _compress(saved, tmp_path / "again", "--config", str(tmp_path / "first" / "compress.toml"), seq_len=())
    assert again == first
    a, b = (json.loads((tmp_path / d / "compress.json").read_text())["settings"] for d in ("first", "again"))
    assert a == b


@pytest.mark.parametrize("extra, text, words", [
    (["--share", "0.5"], "[settings]\nshare = 0.5\n", ["--config with --share"]),
    ([], "[settings]\nshare = 0.5\nkeep = 0.5\n", ["unknown keys ['keep']", "allowed: units, share"]),
    ([], "[other]\nshare = 0.5\n", ["one [settings] table"]),
    ([], "[settings]\nshare = 1.5\n", ["share=1.5; allowed"]),
])
def test_a_bad_settings_file_is_refused_in_one_line(saved, tmp_path, extra, text, words):
    (tmp_path / "c.toml").write_text(text)
    out = tmp_path / "out"
    result = runner.invoke(app, ["compress", str(saved / "model"), "--task", "classification", "--data",
                                 str(saved / "dev.tsv"), "--calib-data", str(saved / "train.tsv"), "--config",
                                 str(tmp_path / "c.toml"), *extra, "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), result.output
    assert not out.exists()
