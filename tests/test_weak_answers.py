"""Bad input a new user met that was answered weakly (issue 28): each is now one line, exit code 2, before any
work, naming what is wrong; and a resume compares files by their content, not by how their paths are spelled."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.errors import ConfigError
from tiny import build, word_tokenizer

runner = CliRunner()
WORDS = "good bad film plot dull fun long short great awful".split()
TEXTS = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(4 + i % 3)) for i in range(12)]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A tiny BERT classifier (3 labels), a tiny rotary Llama (64 positions), a labelled TSV and one without labels."""
    root = tmp_path_factory.mktemp("weak")
    (root / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 3}\n" for i, t in enumerate(TEXTS)))
    (root / "nolabel.tsv").write_text("sentence\tscore\tsource\n" + "".join(f"{t}\t{i}\tweb\n" for i, t in enumerate(TEXTS)))
    (root / "text.txt").write_text(" ".join(TEXTS * 8))
    hp.save_pruned(build("bert"), root / "bert", tokenizer=word_tokenizer(TEXTS))
    hp.save_pruned(build("llama"), root / "llama", tokenizer=word_tokenizer(TEXTS))
    return root


def _refused(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("command, flag", [("prune", "--drop"), ("evaluate", "--heads-off")])
def test_a_head_given_twice_is_refused(root, tmp_path, command, flag):
    """`--drop '{"encoder.0.self": [1, 1]}'` removed head 1 once and said nothing."""
    out = tmp_path / "out"
    args = ["-o", str(out)] if command == "prune" else ["--task", "classification", "--data", str(root / "dev.tsv")]
    line = _refused(runner.invoke(app, [command, str(root / "bert"), flag, '{"encoder.0.self": [1, 1]}', *args]))
    assert line.startswith(f"error: {flag}['encoder.0.self']: head 1 given twice") and "each head once" in line
    assert not out.exists()
    ok = runner.invoke(app, ["prune", str(root / "bert"), "--drop", '{"encoder.0.self": [1, 2]}', "-o", str(out)])
    assert ok.exit_code == 0, ok.output  # distinct heads still go through
    assert hp.kept_heads(hp.load_pruned(out))["encoder.0.self"] == [0, 3]


def _deny_writes(monkeypatch, denied: Path, read_only: bool):
    """os.access says no write to ``denied`` (tests run as root here, where permission bits do not stop writes);
    with ``read_only`` its file system reports ST_RDONLY, as a read-only mount does."""
    access, statvfs = os.access, os.statvfs

    def fake_access(path, mode, *args, **kwargs):
        if Path(path).absolute() == denied.absolute() and mode & os.W_OK:
            return False
        return access(path, mode, *args, **kwargs)

    class Flags:
        def __init__(self, real):
            self.real = real
            self.f_flag = real.f_flag | (os.ST_RDONLY if read_only else 0)

    monkeypatch.setattr(os, "access", fake_access)
    monkeypatch.setattr(os, "statvfs", lambda path: Flags(statvfs(path)) if Path(path).absolute() == denied.absolute()
                        else statvfs(path))


@pytest.mark.parametrize("read_only, why", [(False, "is not writable (no write permission)"),
                                            (True, "is on a read-only file system")])
def test_an_output_that_cannot_be_written_is_named_before_the_model_loads(root, tmp_path, monkeypatch, read_only, why):
    """An unwritable -o said 'no longer empty'; a read-only file system gave a raw [Errno 30] naming a temporary
    folder. Both now name the output, before the model is loaded (load_model is never called)."""
    import headprune.core.io as io

    parent = tmp_path / "parent"
    parent.mkdir()
    out = parent / "pruned"
    _deny_writes(monkeypatch, parent, read_only)
    monkeypatch.setattr(io, "load_model", lambda *a, **k: pytest.fail("the model was loaded before the refusal"))
    line = _refused(runner.invoke(app, ["prune", str(root / "bert"), "--drop", '{"encoder.0.self": [1]}', "-o", str(out)]))
    assert line == f"error: output {str(out)!r} (its folder {str(parent)!r}) {why}; choose a directory you can write to"
    out.mkdir()  # an existing empty directory is judged itself
    _deny_writes(monkeypatch, out, read_only)
    line = _refused(runner.invoke(app, ["prune", str(root / "bert"), "--drop", '{"encoder.0.self": [1]}', "-o", str(out)]))
    assert line == f"error: output {str(out)!r} {why}; choose a directory you can write to"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes through permission bits")
def test_a_directory_without_write_permission_is_refused_for_real(root, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        line = _refused(runner.invoke(app, ["prune", str(root / "bert"), "--drop", '{"encoder.0.self": [1]}', "-o",
                                            str(locked / "out")]))
        assert "is not writable" in line and "no longer empty" not in line
    finally:
        locked.chmod(0o755)


def test_a_file_system_failing_mid_save_names_the_output_not_a_temporary_folder(tmp_path, monkeypatch):
    """The check passed but the file system refuses the temporary sibling folder (e.g. it became read-only)."""
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name.endswith(".tmp"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    out = tmp_path / "model"
    with pytest.raises(ConfigError) as e:
        hp.save_pruned(build("bert"), out)
    assert str(e.value) == (f"output {str(out)!r} cannot be written ({os.strerror(errno.EROFS)}); choose a directory "
                            "you can write to") and ".tmp" not in str(e.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_block_size_past_the_trained_positions_names_max_position_embeddings(root):
    """A rotary model runs past max_position_embeddings without an error, so --block-size 100000 was accepted
    without a word about the model's limit (64 here)."""
    base = ["evaluate", str(root / "llama"), "--task", "lm", "--data", str(root / "text.txt")]
    line = _refused(runner.invoke(app, [*base, "--block-size", "100000"]))
    assert line == ("error: --block-size 100000; allowed: an integer 2..64 (the model's max_position_embeddings=64: "
                    "it was not trained on longer sequences)")
    ok = runner.invoke(app, [*base, "--block-size", "64", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["signature"]["block_size"] == 64


def test_a_file_without_a_label_column_lists_its_columns(root):
    line = _refused(runner.invoke(app, ["evaluate", str(root / "bert"), "--task", "classification", "--data",
                                        str(root / "nolabel.tsv")]))
    assert "has no label column; its columns: sentence, score, source" in line and "--label-column" in line
    ok = runner.invoke(app, ["evaluate", str(root / "bert"), "--task", "classification", "--data",
                             str(root / "nolabel.tsv"), "--label-column", "score", "--label-map",
                             ",".join(f"{i}={i % 3}" for i in range(12))])
    assert ok.exit_code == 0, ok.output  # naming one of the listed columns is the way out


def test_resume_compares_files_by_content_not_path_spelling(root, tmp_path, monkeypatch):
    """The same data named ./dev.tsv, then by its absolute path, was refused as another run ('--data was
    ["dev.tsv"], now [...]'), the flag that really changed mentioned only in a parenthesis."""
    monkeypatch.chdir(root)
    out = tmp_path / "abl"
    args = ["--task", "classification", "--resamples", "800", "-o", str(out), "-q"]
    first = runner.invoke(app, ["ablate", "bert", "--data", "dev.tsv", *args])
    assert first.exit_code == 0, first.output
    units = (out / "units.jsonl").read_bytes()
    again = runner.invoke(app, ["ablate", str(root / "bert"), "--data", str(root / "dev.tsv"), *args])
    assert again.exit_code == 0, again.output
    assert (out / "units.jsonl").read_bytes() == units  # resumed: nothing computed twice
    changed = [a if a != "800" else "900" for a in args]  # both enough for 8 heads at 0.01
    line = _refused(runner.invoke(app, ["ablate", str(root / "bert"), "--data", str(root / "dev.tsv"), *changed]))
    assert line.startswith(f"error: output {str(out)!r} holds another run: --resamples was 800, now 900; pass --fresh")
    other = tmp_path / "other.tsv"  # a different file's content is still a different run
    other.write_text((root / "dev.tsv").read_text().replace("\t0\n", "\t1\n"))
    line = _refused(runner.invoke(app, ["ablate", "bert", "--data", str(other), *args]))
    assert "the contents of --data (sha256) was" in line
