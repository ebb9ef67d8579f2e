"""Files headprune writes for others name models by their own name, never by this machine's absolute paths: a
GGUF's metadata (``general.name``, ``headprune.signature``), its report, a saved model directory, a compress run's
``run.json`` / ``compress.json`` / ``plan.json`` / ``results.json`` -- all made from a deliberately deep folder."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.export.gguf import export_gguf
from headprune.provenance import own_name, portable, portable_path
from llm_tiny import bpe_tokenizer, prune_unevenly, tiny_decoder
from tiny import build, word_tokenizer

runner = CliRunner()
TEXTS = ["a good film", "a bad film", "the plot was thin", "wonderful acting", "dull and long", "loved it",
         "not my kind of story", "a fine cast", "it drags", "sharp and funny"]


@pytest.fixture
def deep(tmp_path):
    """A folder as deep as a user's home: its path must appear in no file written below it."""
    root = tmp_path / "home" / "someone" / "private" / "models"
    root.mkdir(parents=True)
    return root


def leaks(text: str, root: Path) -> list[str]:
    """Pieces of ``text`` that spell ``root``'s folders (its full path or any of its absolute ancestors below /)."""
    marks = [str(root)] + [str(p) for p in root.parents if len(p.parts) > 2]
    return [m for m in marks if m in text]


def absolute_words(text: str) -> list[str]:
    """Words of ``text`` (split at spaces, quotes, '=' and ',') that are absolute paths."""
    for sep in "\"'=,{}[]:":
        text = text.replace(sep, " ")
    return [w for w in text.split() if os.path.isabs(w) and len(w) > 1]


def test_own_name_and_portable_path_by_hand(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert own_name("/home/me/runs/tiny") == "tiny" and own_name("runs/tiny/") == "tiny"
    assert own_name(".") == tmp_path.name  # the working directory's own name
    assert portable_path(tmp_path / "data" / "dev.tsv") == "data/dev.tsv"  # beneath the working directory
    assert portable_path("/elsewhere/me/dev.tsv") == "dev.tsv"  # elsewhere: its own name
    assert portable_path("data/dev.tsv") == "data/dev.tsv" and portable_path("builtin:pydoc") == "builtin:pydoc"
    sig = {"model": Path("/home/me/m"), "data": ["/home/me/a.tsv", "b.tsv"], "n": 3, "top": None,
           "command": f"compress /home/me/m --data={tmp_path}/x/dev.tsv -o out", "method": "taylor heads (flops)"}
    assert portable(sig) == {"model": "m", "data": ["a.tsv", "b.tsv"], "n": 3, "top": None,
                             "command": "compress m --data=x/dev.tsv -o out", "method": "taylor heads (flops)"}


def _gguf_strings(path: Path) -> dict[str, list[str]]:
    """Every string of the GGUF's metadata, read back by the gguf package's own reader (not headprune's)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for key, field in reader.fields.items():
        value = field.contents()
        values = value if isinstance(value, list) else [value]
        strings = [v for v in values if isinstance(v, str)]
        if strings:
            out[key] = strings
    return out


def test_gguf_export_from_a_deep_folder_holds_no_absolute_path(deep):
    pytest.importorskip("gguf")
    model, tok = tiny_decoder("llama"), bpe_tokenizer()
    prune_unevenly(model)
    hp.save_pruned(model, deep / "first", tok)
    again = hp.load_pruned(deep / "first")  # its config's _name_or_path is now the absolute folder
    assert leaks(str(again.config._name_or_path), deep)  # so the check below can fail
    hp.save_pruned(again, deep / "tiny-pruned", tok)
    r = runner.invoke(app, ["export", str(deep / "tiny-pruned"), "--format", "gguf", "-o", str(deep / "p.gguf")])
    assert r.exit_code == 0, r.output
    strings = _gguf_strings(deep / "p.gguf")
    assert strings["general.name"] == ["tiny-pruned"]
    assert json.loads(strings["headprune.signature"][0]) == {"model": "tiny-pruned"}
    for key, values in strings.items():
        for value in values:
            assert not leaks(value, deep), (key, value)
            if not key.startswith("tokenizer.ggml."):  # vocabulary entries are text, not paths
                assert not absolute_words(value), (key, value)
    default = deep / "d.gguf"  # the library's default name: the config's _name_or_path, by its base name
    export_gguf(again, default, tokenizer=tok, reload=False)
    assert _gguf_strings(default)["general.name"] == ["first"]
    _no_leak_below(deep)


def _no_leak_below(root: Path) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        text = path.read_bytes().decode("latin-1")  # bytes as they are: a path inside a binary file shows too
        assert not leaks(text, root), f"{path.relative_to(root)} holds {leaks(text, root)}"


def test_compress_run_from_a_deep_folder_holds_no_absolute_path(deep, monkeypatch):
    model = build("bert")
    model.config.id2label, model.config.label2id = {0: "0", 1: "1", 2: "2"}, {"0": 0, "1": 1, "2": 2}
    hp.save_pruned(model, deep / "bert-tiny", tokenizer=word_tokenizer(TEXTS))
    for name, rows in (("dev.tsv", TEXTS), ("train.tsv", TEXTS[::-1] * 2)):
        (deep / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(rows)))
    monkeypatch.chdir(deep.parent)  # the model and data lie beneath the working directory: relative there
    out = deep / "run"
    args = ["compress", str(deep / "bert-tiny"), "--task", "classification", "--data", str(deep / "dev.tsv"),
            f"--calib-data={deep / 'train.tsv'}", "--seq-len", "8", "--batch-size", "4", "--no-bench", "--share",
            "0.5", "-o", str(out)]
    monkeypatch.setattr(sys, "argv", ["headprune", *args])  # the command line the run records
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    sig = json.loads((out / "compress.json").read_text())["signature"]
    assert sig["model"] == "bert-tiny" and sig["data"] == ["models/dev.tsv"]
    assert json.loads((out / "run.json").read_text())["signature"] == sig
    assert sig["calib_data"] == ["models/train.tsv"]
    evaluated = json.loads((out / "compress.json").read_text())["evaluation"]["after"]["extra"]["signature"]
    assert evaluated["data"] == "models/dev.tsv"  # the evaluator's own signature too
    for name in ("compress.json", "run.json", "plan.json", "results.json", "config.json"):
        assert not absolute_words((out / name).read_text()), name
    _no_leak_below(deep)
