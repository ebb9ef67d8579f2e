"""Run directories you can trust (issue 13, items 3 and 5): strict resume, nothing written on refusal,
foreign folders refused, one run at a time, no links followed, a report that reads only its own folder,
and a deterministic stop-and-resume that ends byte for byte where an uninterrupted run does."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.experiments.rundir import STOP_ENV, STOPPED, RunDir
from tiny import build, word_tokenizer

runner = CliRunner()
WORDS = "the a film was good bad very not quite an old new story plot actor scene long short".split()


def _texts(n: int, length: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (length,), generator=g).tolist())
            for _ in range(n)]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A tiny random GPT-2 (8 heads), a tiny RoBERTa classifier (2 labels), a text and a labelled file."""
    root = tmp_path_factory.mktemp("runs")
    (root / "text.txt").write_text("\n".join(_texts(80, 12, seed=0)))  # 8 blocks of 128 tokens
    (root / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n"
                                                                for i, t in enumerate(_texts(24, 6, seed=1))))
    tok = word_tokenizer(WORDS)
    hp.save_pruned(_gpt2(), root / "gpt2", tokenizer=tok)
    hp.save_pruned(build("roberta"), root / "roberta", tokenizer=tok)
    return root


def _gpt2(seed: int = 0):
    """Tiny random GPT-2 with room for the study commands' 128-token blocks."""
    import transformers as T

    torch.manual_seed(seed)
    return T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, vocab_size=64,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()


def _ablate(root: Path, out, *extra: str) -> list[str]:
    return ["ablate", str(root / "gpt2"), "--task", "lm", "--data", str(root / "text.txt"),
            "--limit", "6", "--resamples", "1000", "-o", str(out), *extra]


def _refused(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def whole(root, tmp_path_factory) -> Path:
    """An uninterrupted one-head ablation, written as ``run`` under its own folder (a relative -o)."""
    base = tmp_path_factory.mktemp("whole")
    cwd = os.getcwd()
    os.chdir(base)
    try:
        result = runner.invoke(app, _ablate(root, "run"))
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    return base / "run"


# ------------------------------------------------------------------------------- stop and resume


def test_stopped_after_k_units_and_resumed_equals_an_uninterrupted_run_byte_for_byte(root, whole, tmp_path,
                                                                                      monkeypatch):
    rows = _rows(whole / "ablation.csv")
    assert len(rows) == 8 and len({r["score"] for r in rows}) == 8, "every unit must differ, or a mix-up hides"
    monkeypatch.chdir(tmp_path)
    cut = tmp_path / "run"
    stopped = runner.invoke(app, _ablate(root, "run"), env={STOP_ENV: "3"})
    assert stopped.exit_code == STOPPED, stopped.output
    assert len((cut / "units.jsonl").read_text().splitlines()) == 3
    assert not (cut / "results.json").exists() and not (cut / "run.lock").exists()
    with open(cut / "units.jsonl", "ab") as f:  # a kill in the middle of writing the 4th unit
        f.write(b'{"unit": "decoder.1.self:0", "site": "decod')
    again = runner.invoke(app, _ablate(root, "run"), env={STOP_ENV: "2"})  # two more, then stop again
    assert again.exit_code == STOPPED, again.output
    assert len((cut / "units.jsonl").read_text().splitlines()) == 5  # the cut line dropped, written whole
    done = runner.invoke(app, _ablate(root, "run"))
    assert done.exit_code == 0, done.output
    mine, reference = _files(cut), _files(whole)
    assert sorted(mine) == sorted(reference)
    for name in reference:
        assert mine[name] == reference[name], f"{name} differs from the uninterrupted run"


def test_stopped_curve_resumes_to_the_same_files(root, tmp_path, monkeypatch):
    args = ["curve", str(root / "gpt2"), "--task", "lm", "--data", str(root / "text.txt"),
            "--limit", "6", "--orders", "importance,random", "--step", "0.25", "--seeds", "2", "-o", "run"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert runner.invoke(app, args).exit_code == 0
    monkeypatch.chdir(tmp_path / "b")
    assert runner.invoke(app, args, env={STOP_ENV: "4"}).exit_code == STOPPED
    assert runner.invoke(app, args).exit_code == 0
    a, b = _files(tmp_path / "a" / "run"), _files(tmp_path / "b" / "run")
    assert a == b


def test_stop_value_is_checked(root, tmp_path):
    result = runner.invoke(app, _ablate(root, tmp_path / "r"), env={STOP_ENV: "soon"})
    line = _refused(result)
    assert STOP_ENV in line and "allowed" in line


# --------------------------------------------------------------------------- strict signatures


def _copy(folder: Path, to: Path) -> Path:
    to.mkdir()
    for name, data in _files(folder).items():
        (to / name).write_bytes(data)
    return to


@pytest.mark.parametrize(("extra", "named"), [
    (["--resamples", "1200"], "--resamples was 1000, now 1200"),
    (["--batch-size", "4"], "--batch-size was 8, now 4"),
    (["--limit", "5"], "--limit was 6, now 5"),
    (["--alpha", "0.05"], "--alpha was 0.01, now 0.05"),
    (["--seed", "1"], "--seed was 0, now 1"),
])
def test_a_rerun_with_another_option_is_refused_naming_it(root, whole, tmp_path, extra, named):
    run = _copy(whole, tmp_path / "run")
    before = _files(run)
    line = _refused(runner.invoke(app, _ablate(root, run, *extra)))  # a repeated flag: the last value counts
    assert named in line and "pass --fresh to start over" in line, line
    assert _files(run) == before  # refused: nothing written, no lock left


def test_edited_data_replaced_model_or_changed_code_is_refused(root, whole, tmp_path, monkeypatch):
    import shutil

    data, model = tmp_path / "text.txt", tmp_path / "gpt2"
    shutil.copy(root / "text.txt", data)
    shutil.copytree(root / "gpt2", model)
    args = ["ablate", str(model), "--task", "lm", "--data", str(data), "--limit", "6",
            "--resamples", "1000", "-o", str(tmp_path / "run")]
    assert runner.invoke(app, args).exit_code == 0
    before = _files(tmp_path / "run")
    data.write_text(data.read_text().replace("film", "movie"))  # same path, other contents
    line = _refused(runner.invoke(app, args))
    assert "the contents of --data (sha256) was" in line
    shutil.copy(root / "text.txt", data)
    hp.save_pruned(_gpt2(seed=1), tmp_path / "other", tokenizer=word_tokenizer(WORDS))
    shutil.copy(tmp_path / "other" / "model.safetensors", model / "model.safetensors")  # same directory, new weights
    line = _refused(runner.invoke(app, args))
    assert "the model's files" in line
    shutil.rmtree(model)
    shutil.copytree(root / "gpt2", model)
    monkeypatch.setattr("headprune.experiments.study.code_identity",
                        lambda: {"version": "0.2.0", "commit": "f" * 40, "source_sha256": "0" * 64})
    line = _refused(runner.invoke(app, args))
    assert "the code (" in line
    monkeypatch.undo()
    assert _files(tmp_path / "run") == before
    assert runner.invoke(app, args).exit_code == 0  # the same data, model and code again: resumes


def test_metric_is_part_of_the_signature(root, tmp_path):
    args = ["ablate", str(root / "roberta"), "--task", "classification", "--data", str(root / "dev.tsv"),
            "--resamples", "1000", "--sites", "encoder.0.self", "-o", str(tmp_path / "run")]
    assert runner.invoke(app, args).exit_code == 0
    line = _refused(runner.invoke(app, [*args, "--metric", "f1"]))
    assert "--metric was 'accuracy', now 'f1'" in line
    assert runner.invoke(app, [*args, "--metric", "f1", "--fresh"]).exit_code == 0
    rows = _rows(tmp_path / "run" / "ablation.csv")
    assert len(rows) == 4  # --fresh: only F1 rows, none of the accuracy run's
    assert json.loads((tmp_path / "run" / "results.json").read_text())["metric"] == "f1"


def test_signature_holds_hashes_options_and_code(whole, root):
    from headprune.provenance import file_sha256

    sig = json.loads((whole / "run.json").read_text())["signature"]
    assert sig["data_sha256"]["--data"] == file_sha256(root / "text.txt")
    assert len(sig["model_sha256"]) == 64 and sig["options"]["batch_size"] == 8 and sig["options"]["limit"] == 6
    assert sig["code"]["version"] == hp.__version__ == "0.3.0" and len(sig["code"]["source_sha256"]) == 64
    head = subprocess.run(["git", "-C", str(Path(hp.__file__).parent), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode == 0:  # a checkout: the commit is recorded
        assert sig["code"]["commit"] == head.stdout.strip()


# ------------------------------------------------------------------------- folders and files


def test_a_refused_command_writes_nothing(root, tmp_path):
    out = tmp_path / "run"
    line = _refused(runner.invoke(app, _ablate(root, out, "--sites", "nosuch")))  # refused after the run opened
    assert "nosuch" in line and not out.exists()
    assert runner.invoke(app, _ablate(root, out, "--sites", "decoder")).exit_code == 0  # the corrected command


def test_a_folder_that_is_not_a_run_is_refused(root, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "results.json").write_text('{"my": "numbers"}')
    line = _refused(runner.invoke(app, _ablate(root, out)))
    assert "is not empty (results.json) and holds no headprune run" in line
    assert _files(out) == {"results.json": b'{"my": "numbers"}'}


def test_a_second_run_is_kept_out_by_the_lock_and_a_dead_ones_lock_is_taken_over(root, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:  # a live process that is not this one holds the lock
        (out / "run.lock").write_text(f"{live.pid}\n")
        line = _refused(runner.invoke(app, _ablate(root, out)))
    finally:
        live.communicate()  # its stdin closes: it ends
    assert f"in use by another headprune run (pid {live.pid}" in line
    assert _files(out) == {"run.lock": f"{live.pid}\n".encode()}
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / "run.lock").write_text(f"{dead.pid}\n")
    result = runner.invoke(app, _ablate(root, out))
    assert result.exit_code == 0, result.output
    assert f"left by pid {dead.pid}, which is no longer running" in result.stderr
    assert not (out / "run.lock").exists() and (out / "results.json").is_file()


@pytest.mark.parametrize("name", ["units.jsonl", "results.json", "run.json"])
def test_links_in_a_run_folder_are_refused_not_followed(root, whole, tmp_path, name):
    run = _copy(whole, tmp_path / "run")
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (run / name).unlink()
    (run / name).symlink_to(target)
    line = _refused(runner.invoke(app, _ablate(root, run)))
    assert "symbolic link" in line and name in line
    assert target.read_text() == "keep me"


def test_rundir_writes_refuse_a_link_planted_after_opening(tmp_path):
    run = RunDir(tmp_path / "r", {"model": "m"})
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (tmp_path / "r" / "units.jsonl").symlink_to(target)
    with pytest.raises(hp.ConfigError, match="symbolic link"):
        run.add("a", {"score": 1.0})
    (tmp_path / "r" / "table.csv").symlink_to(target)
    with pytest.raises(hp.ConfigError, match="symbolic link"):
        run.write_csv("table.csv", [{"a": 1}])
    assert target.read_text() == "keep me"
    run.close()


@pytest.mark.parametrize(("key", "name"), [("figures", "/etc/passwd"), ("tables", "../secret.csv"),
                                           ("figures", "link.png")])
def test_report_reads_only_files_inside_the_run_folder(whole, tmp_path, key, name):
    run = _copy(whole, tmp_path / "run")
    (tmp_path / "secret.csv").write_text("secret\nhunter2\n")
    (run / "link.png").symlink_to(tmp_path / "secret.csv")
    results = json.loads((run / "results.json").read_text())
    results[key] = [{"file": name, "title": "x", "caption": "x"}]
    (run / "results.json").write_text(json.dumps(results))
    (run / "report.html").unlink()
    line = _refused(runner.invoke(app, ["report", str(run)]))
    assert name in line and ("outside the run directory" in line or "symbolic link" in line)
    assert not (run / "report.html").exists()


# --------------------------------------------------------------------------------- the library


def test_rundir_resume_rules(tmp_path):
    RunDir(tmp_path / "r", {"model": "a", "n": 3, "versions": {"x": 1}}).write_json("results.json", {})
    RunDir(tmp_path / "r", {"model": "a", "n": 3, "versions": {"x": 2}}).close()  # package versions may differ
    with pytest.raises(hp.ConfigError, match=r"the number of examples was 3, now 4; pass --fresh"):
        RunDir(tmp_path / "r", {"model": "a", "n": 4})
    empty = RunDir(tmp_path / "never", {"model": "a"})
    empty.close()  # nothing written: the folder it made goes again
    assert not (tmp_path / "never").exists()


def test_a_cut_last_line_is_dropped_and_rewritten_once(tmp_path):
    run = RunDir(tmp_path / "r", {"model": "a"})
    run.add("u0", {"score": 0.5})
    run.close()
    units = tmp_path / "r" / "units.jsonl"
    whole = units.read_bytes()
    units.write_bytes(whole + b'{"unit": "u1", "sc')
    run = RunDir(tmp_path / "r", {"model": "a"})
    assert units.read_bytes() == whole and run.done("u0") and not run.done("u1")
    run.add("u1", {"score": 0.25})
    run.close()
    assert RunDir(tmp_path / "r", {"model": "a"}).units == {"u0": {"unit": "u0", "score": 0.5},
                                                            "u1": {"unit": "u1", "score": 0.25}}


def test_library_runs_carry_the_evaluators_settings(root, tmp_path):
    """Without the CLI, the evaluator's own settings (here its batch size) are part of the signature."""
    from headprune.core.io import load_tokenizer
    from headprune.evaluation.lm import LanguageModelling
    from headprune.experiments.ablation import SweepSettings
    from headprune.experiments.rundir import RunOutput
    from headprune.experiments.study import run_ablation

    model, tok = hp.load_pruned(root / "gpt2"), load_tokenizer(root / "gpt2")
    texts = (root / "text.txt").read_text().splitlines()
    site = hp.find_sites(model)[0].name
    settings = SweepSettings(n_resamples=1000)
    ev = LanguageModelling(tok, texts, block_size=32, batch_size=4, max_blocks=4)
    run_ablation(model, ev, RunOutput(tmp_path / "run", progress=False), sites=[site], settings=settings)
    other = LanguageModelling(tok, texts, block_size=32, batch_size=2, max_blocks=4)
    with pytest.raises(hp.ConfigError, match=r"--batch-size \(as the evaluator used it\) was 4, now 2"):
        run_ablation(model, other, RunOutput(tmp_path / "run", progress=False), sites=[site], settings=settings)


@pytest.mark.parametrize("text", ['{"num_labels": 2, "task": "classification"}', "{cut"])
def test_a_run_json_of_another_kind_is_refused_even_with_fresh(root, tmp_path, text):
    out = tmp_path / "train"
    out.mkdir()
    (out / "run.json").write_text(text)
    for extra in ([], ["--fresh"]):
        line = _refused(runner.invoke(app, _ablate(root, out, *extra)))
        assert "not a headprune study run's" in line
        assert _files(out) == {"run.json": text.encode()}
