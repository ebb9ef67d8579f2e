"""Progress a person can trust (issue 28): a bar says how many steps there are, transformers' own bars stay quiet
inside headprune's loads and saves (and come back afterwards). The demo's labels: test_readme_walkthrough.py.

Issue 47: off a terminal (nohup, a pipe, CI, a notebook cell running the command) a stage is plain lines, a
line when it starts and ends and at most one every 30 s in between; ``--quiet`` silences bars and lines."""

from __future__ import annotations

import io
import re
import sys

import pytest
from transformers.utils import logging as hf_logging
from typer.testing import CliRunner

import headprune as hp
from headprune import progress
from headprune.cli import app
from headprune.core.store.quiet import transformers_bars_off
from tiny import build, inputs, labels, word_tokenizer

LINE = re.compile(r"^headprune: (?P<what>[^:]+): (?P<n>\d+)/(?P<total>\d+) (?P<unit>\w+), "
                  r"(?P<minutes>\d\d):(?P<seconds>\d\d) elapsed$")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _batches(n: int) -> list[dict]:
    out = []
    for seed in range(1, n + 1):
        batch = inputs("bert", seed=seed)
        out.append({**batch, "labels": labels("bert", batch, seed=seed)})
    return out


def _lines(err: str, what: str) -> list[re.Match]:
    return [m for m in map(LINE.match, err.splitlines()) if m and m["what"] == what]


def test_the_importance_bar_has_a_total_on_a_terminal(monkeypatch):
    """It read 'importance: 1batch [00:38, 38.56s/batch]': no total, no way to tell how long is left."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    hp.head_importance(build("bert").eval(), _batches(3), progress=True)
    err = terminal.getvalue()
    assert re.search(r"\b3/3 \[", err), err  # n/total, as tqdm writes it when it knows the total
    assert "batch/s" in err or "s/batch" in err  # and its unit
    assert "\r" in err and not _lines(err, "importance")  # a bar redrawn in place, not plain lines


class _Timed:
    """Batches whose reading takes ``seconds`` each on the fake clock (the forward pass itself takes none)."""

    def __init__(self, batches: list[dict], now: list[float], seconds: float):
        self.batches, self.now, self.seconds = batches, now, seconds

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            self.now[0] += self.seconds
            yield batch


def test_off_a_terminal_a_stage_is_plain_lines_at_most_one_every_30_seconds(monkeypatch, capsys):
    """A real importance pass over 13 batches of 11 s each (a fake clock): the lines expected are worked out here
    from the rule alone -- one at the start, one when 30 s or more passed since the last, one at the end."""
    now = [0.0]
    monkeypatch.setattr(progress, "clock", lambda: now[0])
    hp.head_importance(build("bert").eval(), _Timed(_batches(13), now, 11.0), progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err  # no bar redrawn into a log

    expected, last = [(0, 0.0)], 0.0  # (n, elapsed) of each line
    for n in range(1, 14):  # batch n is done at 11 n s
        if 11.0 * n - last >= progress.INTERVAL:
            expected.append((n, 11.0 * n))
            last = 11.0 * n
    if expected[-1][0] != 13:
        expected.append((13, 11.0 * 13))
    lines = _lines(err, "importance")
    assert [(int(m["n"]), 60 * int(m["minutes"]) + int(m["seconds"])) for m in lines] == expected, err
    assert expected == [(0, 0), (3, 33), (6, 66), (9, 99), (12, 132), (13, 143)]  # the rule, spelled out
    assert {(m["total"], m["unit"]) for m in lines} == {("13", "batches")}
    within = [b[1] - a[1] for a, b in zip(expected[:-1], expected[1:-1], strict=False)]
    assert min(within) >= progress.INTERVAL  # the throttle: never two lines within 30 s inside the stage


def test_lines_say_what_a_bar_would_and_nothing_when_not_shown(monkeypatch, capsys):
    now = [100.0]
    monkeypatch.setattr(progress, "clock", lambda: now[0])
    with progress.progress_bar(total=2, desc="distill", unit="batch") as bar:
        for _ in range(2):
            now[0] += 45.0
            bar.set_postfix(loss="0.5000", refresh=False)
            bar.update()
    for _ in progress.progress_bar(iter(range(4)), desc="unknown", unit="step"):  # no len: a count, no total
        pass
    for _ in progress.progress_bar(range(4), desc="silent", unit="step", show=False):
        pass
    progress.note("loading m ...")  # a step without a count: on a terminal only (test_hostile_inputs.py)
    assert capsys.readouterr().err.splitlines() == [
        "headprune: distill: 0/2 batches, 00:00 elapsed",
        "headprune: distill: 1/2 batches, 00:45 elapsed, loss=0.5000",
        "headprune: distill: 2/2 batches, 01:30 elapsed, loss=0.5000",
        "headprune: unknown: 0 steps, 00:00 elapsed",
        "headprune: unknown: 4 steps, 00:00 elapsed",
    ]


def test_the_cli_prints_its_stages_off_a_terminal_and_nothing_with_quiet(tmp_path):
    """`headprune importance` into a pipe (CliRunner's stderr is not a terminal): the scoring pass as plain lines,
    with n/total and the time elapsed, and nothing else (the loading note is for a terminal); with --quiet stderr
    is empty and the results the same."""
    words = "the a good bad film plot slow fun".split()
    hp.save_pruned(build("bert"), tmp_path / "model", tokenizer=word_tokenizer(words))
    rows = [f"{' '.join(words[(i + j) % 8] for j in range(3 + i % 4))}\t{i % 3}" for i in range(10)]
    (tmp_path / "data.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    args = ["importance", str(tmp_path / "model"), "--task", "classification", "--data", str(tmp_path / "data.tsv"),
            "--batch-size", "4"]
    runner = CliRunner()
    shown = runner.invoke(app, [*args, "-o", str(tmp_path / "shown")])
    assert shown.exit_code == 0, shown.output
    lines = _lines(shown.stderr, "importance")
    assert [(m["n"], m["total"]) for m in lines] == [("0", "3"), ("3", "3")], shown.stderr  # 10 examples, 4 a batch
    assert len(shown.stderr.splitlines()) == len(lines), shown.stderr
    quiet = runner.invoke(app, [*args, "-o", str(tmp_path / "quiet"), "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    assert (tmp_path / "quiet" / "importance.csv").read_text() == (tmp_path / "shown" / "importance.csv").read_text()


@pytest.mark.parametrize("enabled", [True, False])
def test_transformers_bars_are_off_inside_headprune_and_restored(tmp_path, capsys, enabled):
    """'Writing model shards' (save) and 'Loading weights' (load) printed on every save_pruned / load_pruned;
    headprune turns them off for its own calls only and leaves the user's setting as it found it."""
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        model = build("bert")
        hp.prune_heads(model, {"encoder.0.self": [1]})
        hp.save_pruned(model, tmp_path / "m")
        hp.load_pruned(tmp_path / "m")
        err = capsys.readouterr().err
        assert "Writing model shards" not in err and "Loading weights" not in err, err
        assert hf_logging.is_progress_bar_enabled() is enabled
        if enabled:  # the same save outside headprune still shows transformers' bar: the switch was restored
            model.save_pretrained(tmp_path / "plain")
            assert "Writing model shards" in capsys.readouterr().err
    finally:
        hf_logging.enable_progress_bar()


def test_bars_off_is_restored_when_the_block_raises():
    hf_logging.enable_progress_bar()
    with pytest.raises(RuntimeError), transformers_bars_off():
        assert not hf_logging.is_progress_bar_enabled()
        raise RuntimeError("boom")
    assert hf_logging.is_progress_bar_enabled()


def test_the_gguf_conversion_bar_is_off_inside_headprune(tmp_path, capsys):
    """'Converting and de-quantizing GGUF tensors...' (plain tqdm inside transformers) printed on every load."""
    pytest.importorskip("gguf")
    from gguf_writer import write_llama_gguf

    file = write_llama_gguf(build("llama"), tmp_path / "tiny.gguf")
    hf_logging.enable_progress_bar()
    model = hp.load_model(file)
    err = capsys.readouterr().err
    assert "Converting and de-quantizing" not in err and "Loading weights" not in err, err
    assert hf_logging.is_progress_bar_enabled() and len(hp.find_sites(model)) == 2
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from tqdm.auto import tqdm

    assert gguf_utils.tqdm is tqdm  # transformers' own module is as it was


def test_task_batches_know_their_count_so_every_pass_shows_a_total(capsys):
    """Issue 38: `importance: 0batch [00:15, ?batch/s]` in the demo -- a task's batches were a bare generator.
    Their len is now what they yield (counted here by iterating), and the importance bar prints n/total."""
    from headprune.evaluation.lm import LanguageModelling
    from tiny import word_tokenizer

    texts = ["the cat sat on the mat and then the dog came by " * 6] * 4
    task = LanguageModelling(word_tokenizer(texts), texts, block_size=8, batch_size=3)
    for limit in (None, 5):
        assert len(task.batches(limit=limit)) == sum(1 for _ in task.batches(limit=limit))
    model = build("llama").eval()
    hp.head_importance(model, task.batches(limit=7), progress=True)
    assert [m["total"] for m in _lines(capsys.readouterr().err, "importance")] == ["3", "3"]  # 7 blocks, 3 a batch
