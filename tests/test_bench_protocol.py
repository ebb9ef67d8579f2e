"""The speed protocol: alternating rounds, the median ratio's interval (against scipy's binomial and a
simulated coverage), the load record and the reliability flag, typed errors for bad settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from headprune.bench.protocol import ProtocolSettings, load_record, median_interval, paired_rounds
from headprune.errors import ConfigError


@pytest.mark.parametrize("n", [1, 2, 5, 6, 9, 10, 17, 30, 51])
def test_interval_order_statistics_match_scipy_binomial(n):
    rng = np.random.default_rng(n)
    values = list(rng.lognormal(size=n))
    got = median_interval(values, 0.95)
    # reference: the largest k with 1 - 2 * binom.cdf(k - 1, n, 0.5) >= 0.95, from scipy
    ks = [k for k in range(1, (n + 1) // 2 + 1) if 1 - 2 * stats.binom.cdf(k - 1, n, 0.5) >= 0.95]
    k = max(ks) if ks else 1
    x = sorted(values)
    assert got["low"] == x[k - 1] and got["high"] == x[n - k]
    assert got["median"] == pytest.approx(float(np.median(values)))
    assert got["coverage"] == pytest.approx(1 - 2 * stats.binom.cdf(k - 1, n, 0.5))
    assert got["low"] <= got["median"] <= got["high"]


def test_interval_covers_the_true_median_as_often_as_it_says():
    rng = np.random.default_rng(0)
    n, trials = 15, 4000
    true_median = 1.0  # lognormal(0, s) has median exp(0)
    covered = 0
    for _ in range(trials):
        r = median_interval(list(rng.lognormal(0.0, 0.3, size=n)), 0.95)
        covered += r["low"] <= true_median <= r["high"]
    stated = median_interval(list(range(n)), 0.95)["coverage"]
    assert stated >= 0.95
    se = (stated * (1 - stated) / trials) ** 0.5
    assert abs(covered / trials - stated) < 4 * se


class _Clock:
    """Workloads with known times that record the order in which they were called."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds, self.calls = seconds, []

    def workload(self, name):
        def run():
            self.calls.append(name)
            return self.seconds[name]
        return run


def test_rounds_alternate_and_ratios_are_reference_over_model():
    clock = _Clock({"unpruned": 2.0, "pruned": 0.5})
    s = ProtocolSettings(min_rounds=4, max_rounds=4, budget_s=0.0, warmup=1)
    r = paired_rounds({"unpruned": clock.workload("unpruned"), "pruned": clock.workload("pruned")}, "unpruned", s)
    # warm-up A B, then rounds A B, B A, A B, B A
    assert clock.calls == ["unpruned", "pruned"] + ["unpruned", "pruned", "pruned", "unpruned"] * 2
    assert r["rounds"] == 4 and r["seconds"]["pruned"] == [0.5] * 4
    assert r["ratios"]["pruned"]["median"] == pytest.approx(4.0)
    assert "unpruned" not in r["ratios"] and r["median_s"]["unpruned"] == 2.0
    assert set(r["load"]) >= {"before", "after", "cores", "reliable"}


def test_budget_adds_rounds_up_to_the_maximum():
    clock = _Clock({"a": 1.0, "b": 1.0})
    r = paired_rounds({"a": clock.workload("a"), "b": clock.workload("b")}, "a",
                      ProtocolSettings(min_rounds=2, max_rounds=7, budget_s=60.0, warmup=0))
    assert r["rounds"] == 7 and len(clock.calls) == 14


def test_load_over_the_cores_marks_the_row_unreliable():
    ok = load_record([0.5, 0.4, 0.3], [1.4, 0.9, 0.5], threads=1, cores=2)
    assert ok["reliable"] and ok["other_load"] == pytest.approx(0.5) and ok["reason"] == ""
    busy = load_record([1.8, 1.0, 1.0], [2.5, 1.0, 1.0], threads=1, cores=2)
    assert not busy["reliable"] and "2 usable core" in busy["reason"]
    # the load after the rounds shows other processes that started meanwhile
    late = load_record([0.1, 0.1, 0.1], [3.5, 1.0, 1.0], threads=1, cores=2)
    assert not late["reliable"] and late["other_load"] == pytest.approx(2.5)
    assert not load_record(None, None, 1, 2)["reliable"]


@pytest.mark.parametrize("kwargs, field", [({"min_rounds": 0}, "min_rounds"), ({"min_rounds": 5, "max_rounds": 3},
                                           "max_rounds"), ({"confidence": 1.0}, "confidence"),
                                          ({"budget_s": -1}, "budget_s"), ({"threads": 0}, "threads")])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        ProtocolSettings(**kwargs)


def test_bad_workloads_are_refused():
    with pytest.raises(ConfigError, match="reference"):
        paired_rounds({"a": lambda: 1.0, "b": lambda: 1.0}, "c")
    with pytest.raises(ConfigError, match="workloads"):
        paired_rounds({"a": lambda: 1.0}, "a")
    with pytest.raises(ConfigError, match="positive time"):
        paired_rounds({"a": lambda: 1.0, "b": lambda: 0.0}, "a", ProtocolSettings(warmup=0))


def test_other_processes_cpu_decides_where_measured():
    """Measured CPU of other processes replaces the load average (which counts the benchmark's own recent work):
    a free machine passes even after a busy minute of the benchmark itself; a busy one fails whatever the average."""
    from headprune.bench.protocol import IDLE_SLACK, other_cpu
    own_busy_minute = [1.9, 1.0, 0.5]  # the benchmark's previous workload, in the average
    free = load_record(own_busy_minute, own_busy_minute, threads=2, cores=2, other_cpu=0.04)
    assert free["reliable"] and free["other_load"] == pytest.approx(0.04) and "proc/stat" in free["measure"]
    busy = load_record([0.0] * 3, [0.0] * 3, threads=1, cores=2, other_cpu=1.0 + IDLE_SLACK + 0.01)
    assert not busy["reliable"] and "core(s) busy" in busy["reason"]
    # the arithmetic: (machine busy seconds - own seconds) per wall second, never negative
    assert other_cpu((0.0, 10.0, 4.0), (2.0, 14.0, 6.0)) == pytest.approx(1.0)
    assert other_cpu((0.0, 10.0, 4.0), (2.0, 11.0, 6.0)) == 0.0
    assert other_cpu(None, (1.0, 1.0, 1.0)) is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs /proc/stat")
def test_a_spinning_process_beside_the_rounds_is_seen():
    import subprocess
    import sys
    import time

    def spin():  # this process's own work: counted as the benchmark's
        end = time.perf_counter() + 0.15
        while time.perf_counter() < end:
            pass
        return 0.15
    settings = ProtocolSettings(min_rounds=3, max_rounds=3, budget_s=0.0, warmup=0, threads=1)
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        seen = paired_rounds({"a": spin, "b": spin}, "a", settings)["load"]
    finally:
        child.kill()
        child.wait()
    assert seen["other_cpu"] >= 0.6  # the child's core (more if the machine is busier), not the benchmark's own
