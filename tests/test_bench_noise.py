"""bench's measurement noise, with a fake clock (no test depends on this machine's speed): the spread of the
rounds is reported, a speed-up too noisy to read is flagged in bench.json and warned about, and the
examples/s columns and the speed-up come from the same rounds."""

from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

import headprune as hp
import headprune.bench.timing as timing
from headprune.bench import BenchSettings, benchmark
from headprune.cli import app
from tiny import build

QUIET = {"ref": [1.00, 1.01, 0.99, 1.00, 1.00], "model": [0.50, 0.505, 0.495, 0.50, 0.50]}  # ratio 2.0 each round
NOISY_RATIO = {"ref": [1.00, 1.00, 1.00, 1.00, 1.00], "model": [0.97, 1.00, 1.02, 0.99, 1.03]}  # 1x +- 3%
NOISY_TIMES = {"ref": [1.0, 1.3, 0.8, 1.2, 0.9], "model": [0.5, 0.65, 0.4, 0.6, 0.45]}  # stable 2x, times +-30%


def fake_clock(monkeypatch, seconds: dict[str, list[float]]) -> None:
    """Replace the one timing function: the first model timed is the reference, the next the other model;
    each call returns that model's next time (wall and CPU alike)."""
    names: dict[int, str] = {}
    queues = {k: list(v) for k, v in seconds.items()}

    def time_forward(model, inputs, calls):
        if id(model) not in names:
            names[id(model)] = ["ref", "model"][len(names)]
        t = queues[names[id(model)]].pop(0)
        return t, t

    monkeypatch.setattr(timing, "time_forward", time_forward)
    monkeypatch.setattr(timing, "loadavg", lambda: [0.0, 0.0, 0.0])  # a quiet machine, whatever this one's load
    monkeypatch.setattr(timing, "cpu_clock", lambda: None)  # ... measured by the load average alone


def _bench(monkeypatch, seconds):
    fake_clock(monkeypatch, seconds)
    return benchmark({"a": build("bert"), "b": build("bert", seed=1)},
                     BenchSettings(batch_sizes=(2,), seq_len=4, warmup=0, repeats=5, memory=False, min_repeat_s=0.0))


def test_quiet_rounds_are_not_flagged_and_columns_match_the_ratio(monkeypatch):
    result = _bench(monkeypatch, QUIET)
    up = result.speedups[0]
    assert up["noisy"] is False and up["measured"] == pytest.approx(2.0) and up["measured_iqr"] == pytest.approx(0)
    runs = {r["model"]: r for r in result.runs}
    assert runs["a"]["examples_per_s"] == pytest.approx(2 / statistics.median(QUIET["ref"]))  # the same rounds
    assert runs["b"]["examples_per_s"] == pytest.approx(2 / statistics.median(QUIET["model"]))
    assert runs["a"]["seconds"] == QUIET["ref"] and runs["b"]["seconds"] == QUIET["model"]
    assert result.warnings() == []
    table = " ".join(result.table().split())
    assert "ratio IQR" in table and "median over the same rounds of the paired ratio" in table
    assert "noisy" not in table


@pytest.mark.parametrize("seconds, reason", [(NOISY_RATIO, "ratio"), (NOISY_TIMES, "times")])
def test_noisy_rounds_are_flagged_and_warned(monkeypatch, seconds, reason):
    result = _bench(monkeypatch, seconds)
    up = result.speedups[0]
    ratios = [a / b for a, b in zip(seconds["ref"], seconds["model"], strict=True)]
    assert up["measured"] == pytest.approx(statistics.median(ratios)) and up["noisy"] is True
    q25, q75 = statistics.quantiles(ratios, n=4, method="inclusive")[::2]
    assert up["measured_iqr"] == pytest.approx(q75 - q25)
    if reason == "ratio":  # the IQR is wider than the distance from 1: faster or slower cannot be told
        assert up["measured_iqr"] > abs(up["measured"] - 1) and max(up["times_relative_iqr"].values()) <= 0.1
    else:  # the ratio is steady, but each model's times spread by 30%
        assert up["measured_iqr"] == pytest.approx(0) and up["times_relative_iqr"]["reference"] == pytest.approx(0.3)
    [warning] = result.warnings()
    assert warning.startswith("warning: b vs a at batch 2:") and "too noisy" in warning and "--repeats" in warning
    assert "!" in result.table() and "the speed-up cannot be read" in " ".join(result.table().split())


@pytest.mark.parametrize("seconds, noisy", [(QUIET, False), (NOISY_RATIO, True)])
def test_cli_bench_records_and_warns(monkeypatch, tmp_path, seconds, noisy):
    hp.save_pruned(build("bert"), tmp_path / "bert")
    fake_clock(monkeypatch, seconds)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", str(tmp_path / "bert"), "--batch-sizes", "2", "--seq-len", "8",
                                      "--repeats", "5", "--warmup", "0", "--min-repeat-s", "0", "--no-memory",
                                      "--prune-fraction", "0.5", "-o", str(out)])
    assert result.exit_code == 0, result.output
    [up] = json.loads((out / "bench.json").read_text())["speedups"]
    assert up["noisy"] is noisy and up["model"] == "bert-pruned0.5"
    assert ("warning: bert-pruned0.5 vs bert at batch 2" in result.stderr) is noisy
    assert "warning" not in result.stdout
    assert "median over the same rounds of the paired ratio" in " ".join(result.stdout.split())


def test_table_shows_the_columns_own_ratio_beside_the_paired_speed_up(monkeypatch):
    load_change = {"ref": [1.0, 1.0, 2.0, 2.0, 2.0], "model": [0.5, 0.5, 1.6, 1.6, 1.6]}  # the machine got busier
    result = _bench(monkeypatch, load_change)
    runs = {r["model"]: r for r in result.runs}
    row = next(line for line in result.table().splitlines() if line.startswith("b "))
    col_ratio, paired = row.split()[5:7]
    assert float(col_ratio.rstrip("x")) == pytest.approx(runs["b"]["examples_per_s"] / runs["a"]["examples_per_s"],
                                                         abs=1e-3)
    # the rounds' times spread: bench.json marks the paired speed-up noisy, so the table shows no number for it
    up = result.speedups[0]
    assert up["noisy"] and paired == "noisy!"
    assert up["measured"] == pytest.approx(statistics.median([2.0, 2.0, 1.25, 1.25, 1.25]), abs=1e-3)
    assert "col ratio" in result.table()


def test_a_busy_machine_marks_every_speed_up_unreliable_and_warns(monkeypatch):
    fake_clock(monkeypatch, QUIET)
    monkeypatch.setattr(timing, "loadavg", lambda: [64.0, 64.0, 64.0])  # more load than any machine's cores
    result = benchmark({"a": build("bert"), "b": build("bert", seed=1)},
                       BenchSettings(batch_sizes=(2,), seq_len=4, warmup=0, repeats=5, memory=False, min_repeat_s=0.0))
    up = result.speedups[0]
    assert up["reliable"] is False and result.machine["load"]["reliable"] is False
    assert up["measured_low"] <= up["measured"] <= up["measured_high"]
    [warning] = result.warnings()
    assert "busy" in warning and "unreliable" in warning


def test_quiet_machine_speed_ups_carry_the_median_interval(monkeypatch):
    result = _bench(monkeypatch, QUIET)
    up = result.speedups[0]
    assert up["reliable"] is True and up["measured_low"] == pytest.approx(2.0) and 0 < up["coverage"] < 1
