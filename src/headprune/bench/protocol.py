"""The speed protocol every quoted speed figure goes through: paired, alternating rounds on a shared machine.

A workload is a callable that runs once and returns the seconds its timed part took (the caller synchronises
a GPU and leaves set-up such as a decode's prefill outside the clock). :func:`paired_rounds` runs every
workload once per round, in the order A B, B A, A B, ... so a slow drift of the machine hits all of them
alike, and keeps adding rounds until ``min_rounds`` are done and ``budget_s`` has passed (or ``max_rounds``).

Reported per workload with a reference: the median over rounds of the paired ratio reference time / its time
(> 1: faster), with a distribution-free confidence interval for that median (order statistics of the paired
ratios, from the binomial distribution: no assumption on their shape; with few rounds the interval is
[min, max] and its actual coverage is stated). A row is **unreliable** (kept in the file, never quoted as a
result) when other processes' load plus the threads the benchmark itself runs exceeds the cores it may use.

Other processes' load is measured where the platform allows (Linux ``/proc/stat``): the machine's busy CPU
seconds during the rounds minus this process's own (``getrusage``, every thread, and waited children), per
second of the rounds (:func:`cpu_clock`), with :data:`IDLE_SLACK` of a core allowed for background daemons.
The 1-minute load average is recorded before and after as well, and is the measure where there is no
``/proc/stat``: it includes the benchmark's own recent work (a benchmark that times one workload after another
sees its previous one in it, and a run on every core never passes), so there other processes' load is
``max(before, after - threads)``.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from ..checks import check_int, check_number
from ..errors import ConfigError
from .machine import loadavg


@dataclass(frozen=True)
class ProtocolSettings:
    min_rounds: int = 5  # rounds always run (each runs every workload once)
    max_rounds: int = 51  # never more, whatever the budget
    budget_s: float = 10.0  # after min_rounds, add rounds while less than this has passed since the first
    warmup: int = 1  # untimed calls of every workload before the rounds
    confidence: float = 0.95  # nominal coverage of the median ratio's interval
    threads: int = 1  # threads the benchmark itself keeps busy (torch.get_num_threads() on CPU, 1 driving a GPU)

    def __post_init__(self):
        check_int("min_rounds", self.min_rounds, 1)
        check_int("max_rounds", self.max_rounds, self.min_rounds)
        check_number("budget_s", self.budget_s, low=0.0)
        check_int("warmup", self.warmup, 0)
        check_number("confidence", self.confidence, low=0.0, strict=True)
        if self.confidence >= 1:
            raise ConfigError(f"confidence={self.confidence!r}; allowed: a number in (0, 1)")
        check_int("threads", self.threads, 1)


def paired_rounds(workloads: Mapping[str, Callable[[], float]], reference: str,
                  settings: ProtocolSettings | None = None) -> dict:
    """Time ``workloads`` ({name: callable returning seconds}) in alternating rounds; compare each with
    ``reference``. Returns {"settings", "seconds": {name: [per round]}, "median_s": {name: s},
    "ratios": {name: median ratio, interval, coverage}, "load": before/after/cores, "reliable", "reason"}."""
    s = settings or ProtocolSettings()
    if not isinstance(workloads, Mapping) or len(workloads) < 2:
        raise ConfigError("workloads: expected a mapping name -> callable with at least two entries")
    names = list(workloads)
    if reference not in names:
        raise ConfigError(f"reference={reference!r}; allowed: one of {names}")
    before = loadavg()
    for _ in range(s.warmup):
        for n in names:
            workloads[n]()
    clock = cpu_clock()
    times: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    rounds = 0
    while rounds < s.min_rounds or (rounds < s.max_rounds and time.perf_counter() - start < s.budget_s):
        for n in (names if rounds % 2 == 0 else names[::-1]):
            seconds = float(workloads[n]())
            if not seconds > 0:
                raise ConfigError(f"workload {n!r} returned {seconds!r} seconds; allowed: a positive time")
            times[n].append(seconds)
        rounds += 1
    load = load_record(before, loadavg(), s.threads, other_cpu=other_cpu(clock, cpu_clock()))
    ratios = {n: median_interval([a / b for a, b in zip(times[reference], times[n], strict=True)], s.confidence)
              for n in names if n != reference}
    return {"settings": asdict(s), "reference": reference, "rounds": rounds,
            "elapsed_s": time.perf_counter() - start, "seconds": times,
            "median_s": {n: statistics.median(t) for n, t in times.items()}, "ratios": ratios,
            "load": load, "reliable": load["reliable"], "reason": load["reason"]}


IDLE_SLACK = 0.1  # cores of other processes' CPU use counted as an idle machine (daemons, the shell, the clock)


def cpu_clock() -> tuple[float, float, float] | None:
    """(monotonic seconds, busy CPU seconds of the whole machine, CPU seconds of this process -- every thread --
    and its waited children), or None where there is no ``/proc/stat``."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 5:
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal (guest is in user)
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    own = sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))
    return time.monotonic(), busy, own


def other_cpu(start: tuple[float, float, float] | None, end: tuple[float, float, float] | None) -> float | None:
    """Cores other processes kept busy between two :func:`cpu_clock` readings (None without both)."""
    if start is None or end is None or end[0] <= start[0]:
        return None
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0]))


def load_record(before: list[float] | None, after: list[float] | None, threads: int,
                cores: int | None = None, other_cpu: float | None = None) -> dict:
    """The 1-minute load before and after, the cores usable, and whether the machine was free enough: other
    processes' load plus ``threads`` at most ``cores``. Other processes' load is ``other_cpu`` (cores they kept
    busy during the rounds, :func:`other_cpu`; up to :data:`IDLE_SLACK` of a core counts as idle) where
    measured, else ``max(before, after - threads)`` of the load average."""
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    out = {"before": before[0] if before else None, "after": after[0] if after else None, "cores": cores,
           "threads": threads, "other_cpu": other_cpu}
    if other_cpu is not None:
        reliable = other_cpu + threads <= cores + IDLE_SLACK
        reason = "" if reliable else (f"other processes kept {other_cpu:.2f} core(s) busy + {threads} benchmark "
                                      f"thread(s) > {cores} usable core(s)")
        return out | {"other_load": other_cpu, "measure": "CPU seconds of other processes (/proc/stat)",
                      "reliable": reliable, "reason": reason}
    if before is None or after is None:
        return out | {"other_load": None, "measure": None, "reliable": False,
                      "reason": "the platform reports neither CPU times nor a load average"}
    other = max(before[0], after[0] - threads)
    reliable = other + threads <= cores
    reason = "" if reliable else (f"load of other processes {other:.2f} + {threads} benchmark thread(s) > "
                                  f"{cores} usable core(s)")
    return out | {"other_load": other, "measure": "1-minute load average", "reliable": reliable, "reason": reason}


def median_interval(values: list[float], confidence: float = 0.95) -> dict:
    """Median of ``values`` with the distribution-free interval [x_(k), x_(n-k+1)] (sorted, 1-based), the
    largest k whose coverage 1 - 2 P(Binomial(n, 1/2) < k) is at least ``confidence``; k = 1 where none
    reaches it (then ``coverage`` says what [min, max] covers)."""
    if not values:
        raise ConfigError("values: expected at least one value")
    x = sorted(values)
    n = len(x)
    k = 1
    while k + 1 <= (n + 1) // 2 and _coverage(n, k + 1) >= confidence:
        k += 1
    return {"median": statistics.median(x), "low": x[k - 1], "high": x[n - k], "coverage": _coverage(n, k),
            "confidence": confidence, "n": n, "paired": list(values)}


def _coverage(n: int, k: int) -> float:
    """P(x_(k) <= median <= x_(n-k+1)) for n draws of a continuous distribution: 1 - 2 P(Binomial(n, 1/2) < k)."""
    tail = sum(math.comb(n, i) for i in range(k)) / 2 ** n
    return 1 - 2 * tail
