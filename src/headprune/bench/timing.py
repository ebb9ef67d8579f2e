"""Inference speed of original, pruned and masked models, and the FLOP limit to judge it against.

FLOPs come from the one counter, :mod:`headprune.core.model.cost` (matmul FLOPs of one example's forward
at ``seq_len`` tokens); the FLOP limit of a speed-up is the ratio of the two models' FLOPs.

Timing: every model gets the same inputs; untimed warm-up calls, then rounds in which each model
runs once, in the order A B, B A, A B, ... (``alternate=True``), so slow drift of the machine hits
all models alike. Each round's time is the mean over ``calls`` forwards (chosen so that a repeat lasts
at least ``min_repeat_s``). Reported: median and quartiles over rounds; the measured speed-up is the
median over rounds of the paired ratio reference time / model time, beside the FLOP limit; the
examples/s columns and the speed-up come from the same rounds, with the median's distribution-free interval
(``measured_low`` / ``measured_high``, :mod:`.protocol`); every speed-up is marked ``reliable`` only when the
load of other processes plus torch's threads stayed within the cores (a warning says so otherwise). A
speed-up is flagged ``noisy`` when
the IQR of its paired ratios is wider than its distance from 1 (it cannot tell faster from slower) or
either model's round times have an IQR above :data:`NOISY_TIMES` of their median.
``cpu_s`` / ``measured_cpu`` are the same from process CPU time: a diagnostic that other processes
disturb less than wall-clock time (but OpenMP threads spin while they wait, so it is not pure work).

Memory: the peak growth of the process's resident set during the first (untimed) forward of each
model and batch size (:func:`.machine.peak_rss_delta`), beside the bytes of parameters and buffers.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..checks import check_choice
from ..core.masks.masking import is_masked
from ..core.model.cost import flop_breakdown
from ..core.model.devices import input_device, peak_device_bytes, synchronize, to_device
from ..core.model.inputs import example_inputs, unwrap
from ..core.model.kept import original_heads
from ..core.model.kvcache import kv_cache_bytes
from ..core.model.records import DroppedHeads
from ..core.model.sites import find_sites
from ..errors import ConfigError
from ..progress import progress_bar
from ..provenance import versions
from ..selection.budgets import Budget, HeadRule
from ..selection.gqa import kv_groups, select_gqa
from .figures import bench_plot, bench_table, bench_warnings
from .machine import loadavg, machine_info, peak_rss_delta
from .protocol import cpu_clock, load_record, median_interval, other_cpu
from .settings import PRUNE_ORDERS, BenchSettings

NOISY_TIMES = 0.10  # a model's round times with IQR / median above this are too noisy to read a speed-up from


def fraction_plan(model: nn.Module, fraction: float, *, order: str = "index", seed: int = 0,
                  gqa: str = "uniform") -> DroppedHeads:
    """Heads to remove, ``fraction`` of all: ``order="index"`` the lowest head indices of every site in
    turn (even: the same count per site, +-1); ``"random"`` a seeded random global choice (uneven).
    ``gqa``: the mode of :mod:`headprune.selection.gqa` (default: the KV cache never grows)."""
    check_choice("order", order, PRUNE_ORDERS)
    g = torch.Generator().manual_seed(seed)
    sites = find_sites(model)
    scores = {s.name: torch.arange(s.num_heads, dtype=torch.float32) if order == "index"
              else torch.rand(s.num_heads, generator=g) for s in sites}
    return select_gqa(scores, kv_groups(model), Budget.of(fraction=fraction), HeadRule(gqa))


# ---------------------------------------------------------------- timing

@dataclass
class BenchResult:
    """JSON-ready results: ``models`` (name -> size, FLOPs), ``runs`` (one per model and batch size),
    ``speedups`` (one per model with a reference, and batch size)."""

    settings: dict
    machine: dict
    versions: dict
    models: dict[str, dict]
    runs: list[dict]
    speedups: list[dict]
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def speedup(self, model: str, batch: int) -> dict:
        found = [s for s in self.speedups if s["model"] == model and s["batch"] == batch]
        if not found:
            raise ConfigError(f"no speed-up for model={model!r} at batch={batch}; models with a reference: "
                              f"{sorted({s['model'] for s in self.speedups})}, batch sizes {self.settings['batch_sizes']}")
        return found[0]

    def table(self) -> str:
        """Plain-text table: examples/s (IQR), latency, measured speed-up (IQR), FLOP limit, efficiency;
        a footer says how each is computed."""
        return bench_table(self)

    def warnings(self) -> list[str]:
        """One line per speed-up too noisy to be read (``noisy``), saying how noisy and what to do."""
        return bench_warnings(self)

    def plot(self, path: str | Path) -> Path:
        """PNG: examples/s vs batch size per model (IQR bars); measured speed-up vs FLOP limit."""
        return bench_plot(self, path)


def benchmark(models: Mapping[str, nn.Module], settings: BenchSettings | None = None, *,
              reference: str | Mapping[str, str] | None = None, progress: bool = False) -> BenchResult:
    """Examples/s, latency and memory of ``models`` ({name: model}) at every batch size of ``settings``
    (default ``BenchSettings()``), with speed-ups.

    ``reference``: the model every other one is compared with (default: the first), or
    {model: its reference} (models not named there have none). Models run in eval mode under
    ``torch.inference_mode`` and are restored to their mode afterwards.
    """
    settings = BenchSettings() if settings is None else settings
    if not isinstance(settings, BenchSettings):
        raise ConfigError(f"settings: expected a BenchSettings, got {type(settings).__name__}")
    if not isinstance(models, Mapping) or not models:
        raise ConfigError("models: expected a non-empty mapping name -> model")
    for name, m in models.items():
        if not isinstance(name, str) or not isinstance(m, nn.Module):
            raise ConfigError(f"models[{name!r}]: expected a string name and an nn.Module, got {type(m).__name__}")
    refs = _references(list(models), reference)
    start, load_start, clock = time.perf_counter(), loadavg(), cpu_clock()
    info = {name: model_info(m, settings.seq_len, settings.tgt_len) for name, m in models.items()}
    modes = {name: m.training for name, m in models.items()}
    times: dict[tuple[str, int], dict[str, list[float]]] = {}  # (model, batch) -> wall / cpu seconds per round
    runs = []
    try:
        for m in models.values():
            m.eval()
        for b in settings.batch_sizes:
            runs += _bench_batch(models, b, settings, times, progress)
    finally:
        for name, m in models.items():
            m.train(modes[name])
    speedups = []
    for name, ref in refs.items():
        for b in settings.batch_sizes:
            speedups.append(_speedup(name, ref, b, times, info))
    settings_dict = {**asdict(settings), "batch_sizes": list(settings.batch_sizes),
                     "repeats": {str(b): settings.repeats_for(b) for b in settings.batch_sizes}, "reference": refs,
                     "noisy_times": NOISY_TIMES,
                     "flop_kind": "FLOPs = 2 x multiply-accumulates of matmuls (Linear + QK^T + AV)"}
    load = load_record(load_start, loadavg(), torch.get_num_threads(), other_cpu=other_cpu(clock, cpu_clock()))
    for s in speedups:  # the speed protocol (.protocol): the median's interval, and whether the machine was free
        interval = median_interval(s["paired"])
        s.update(measured_low=interval["low"], measured_high=interval["high"], coverage=interval["coverage"],
                 reliable=load["reliable"])
    machine = {**machine_info(), "loadavg_start": load_start, "loadavg_end": loadavg(), "load": load}
    return BenchResult(settings_dict, machine, versions(), info, runs, speedups, time.perf_counter() - start)


def _references(names: list[str], reference) -> dict[str, str]:
    if reference is None or isinstance(reference, str):
        ref = names[0] if reference is None else reference
        if ref not in names:
            raise ConfigError(f"reference={ref!r}; allowed: one of {names}")
        return {n: ref for n in names if n != ref}
    if not isinstance(reference, Mapping):
        raise ConfigError(f"reference: expected a model name or a mapping model -> reference, got {reference!r}")
    for n, r in reference.items():
        if n not in names or r not in names or n == r:
            raise ConfigError(f"reference[{n!r}]={r!r}; allowed: two different names of {names}")
    return dict(reference)


def _bench_batch(models, batch: int, s: BenchSettings, times: dict, progress: bool) -> list[dict]:
    names = list(models)
    inputs = {n: to_device(example_inputs(models[n], batch, s.seq_len, tgt_len=s.tgt_len, seed=s.seed),
                           input_device(unwrap(models[n]))) for n in names}
    mem: dict[str, int | None] = {n: None for n in names}
    gpu: dict[str, int | None] = {n: None for n in names}
    first: dict[str, float] = {}
    with torch.inference_mode():
        for i in range(max(s.warmup, 1 if s.memory else 0)):
            for n in names:
                if i == 0 and s.memory:
                    device = input_device(unwrap(models[n]))
                    mem[n], (gpu[n], (first[n], _)) = peak_rss_delta(
                        lambda n=n, device=device: peak_device_bytes(lambda: time_forward(models[n], inputs[n], 1), device))
                else:
                    first[n], _ = time_forward(models[n], inputs[n], 1)
        fastest = min(first.values(), default=0.0)
        calls = max(1, math.ceil(s.min_repeat_s / fastest)) if fastest > 0 else 1
        rounds = s.repeats_for(batch)
        order = ([names if r % 2 == 0 else names[::-1] for r in range(rounds)] if s.alternate
                 else [[n] * rounds for n in names])
        for n in names:
            times[(n, batch)] = {"wall": [], "cpu": []}
        for step in progress_bar(order, desc=f"batch {batch}", unit="round", show=progress, leave=False):
            for n in step:
                wall, cpu = time_forward(models[n], inputs[n], calls)
                times[(n, batch)]["wall"].append(wall)
                times[(n, batch)]["cpu"].append(cpu)
        if progress:
            print(f"batch {batch}: " + ", ".join(f"{n} {batch / statistics.median(times[(n, batch)]['wall']):.1f}/s"
                                                 for n in names), flush=True)
    out = []
    for n in names:
        t = times[(n, batch)]["wall"]
        q25, q75 = _quartiles(t)
        med = statistics.median(t)
        out.append({"model": n, "batch": batch, "calls_per_repeat": calls, "repeats": len(t),
                    "latency_s": med, "latency_s_q25": q25, "latency_s_q75": q75,
                    "latency_s_std": statistics.stdev(t) if len(t) > 1 else 0.0, "latency_s_min": min(t),
                    "cpu_s": statistics.median(times[(n, batch)]["cpu"]),
                    "examples_per_s": batch / med, "examples_per_s_q25": batch / q75,
                    "examples_per_s_q75": batch / q25, "peak_rss_delta_bytes": mem[n],
                    "peak_gpu_bytes": gpu[n], "seconds": t})
    return out


def time_forward(model: nn.Module, inputs: dict, calls: int) -> tuple[float, float]:
    """(wall-clock, process CPU) seconds of one forward, means over ``calls`` (garbage collection paused;
    a GPU is synchronised before the clock starts and before it stops, so the work is timed, not its launch)."""
    enabled = gc.isenabled()
    device = input_device(unwrap(model))
    gc.disable()
    try:
        synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            model(**inputs)
        synchronize(device)
        return (time.perf_counter() - t0) / calls, (time.process_time() - c0) / calls
    finally:
        if enabled:
            gc.enable()


def _speedup(name: str, ref: str, batch: int, times: dict, info: dict) -> dict:
    ref_t, t = times[(ref, batch)], times[(name, batch)]
    paired = [a / b for a, b in zip(ref_t["wall"], t["wall"], strict=True)]
    paired_cpu = [a / b for a, b in zip(ref_t["cpu"], t["cpu"], strict=True)]
    q25, q75 = _quartiles(paired)
    measured = statistics.median(paired)
    limit = info[ref]["flops_per_example"] / max(info[name]["flops_per_example"], 1)
    eff = (measured - 1) / (limit - 1) if abs(limit - 1) > 1e-9 else None
    spread = {"model": _relative_iqr(t["wall"]), "reference": _relative_iqr(ref_t["wall"])}
    noisy = q75 - q25 > abs(measured - 1) or max(spread.values()) > NOISY_TIMES
    return {"model": name, "reference": ref, "batch": batch, "measured": measured, "paired": paired, "measured_q25": q25,
            "measured_q75": q75, "measured_iqr": q75 - q25, "times_relative_iqr": spread, "noisy": noisy,
            "ratio_of_medians": statistics.median(ref_t["wall"]) / statistics.median(t["wall"]),
            "measured_cpu": statistics.median(paired_cpu), "flop_limit": limit, "efficiency": eff}


def _relative_iqr(values: list[float]) -> float:
    q25, q75 = _quartiles(values)
    med = statistics.median(values)
    return (q75 - q25) / med if med > 0 else 0.0


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


# ---------------------------------------------------------------- model, machine, memory

def model_info(model: nn.Module, seq_len: int, tgt_len: int | None = None) -> dict:
    """Parameters, bytes, heads and FLOPs per example of ``model`` (FLOPs at ``seq_len``/``tgt_len``)."""
    eager = unwrap(model)
    params = list(eager.parameters())
    sites = find_sites(eager)
    breakdown = flop_breakdown(eager, seq_len, tgt_len=tgt_len)
    return {"class": type(eager).__name__, "compiled": eager is not model,
            "dtype": str(params[0].dtype) if params else None, "device": str(input_device(eager)),
            "gpu": torch.cuda.get_device_name(input_device(eager)) if input_device(eager).type == "cuda" else None,
            "attn_implementation": getattr(eager.config, "_attn_implementation", None),
            "params": sum(p.numel() for p in params),
            "param_bytes": sum(p.numel() * p.element_size() for p in params)
            + sum(b.numel() * b.element_size() for b in eager.buffers()),
            "sites": len(sites), "heads": sum(s.num_heads for s in sites),
            "heads_original": sum(original_heads(eager).values()),
            "masked": is_masked(eager),
            "flops_per_example": breakdown["total"], "flops_breakdown": breakdown,
            **_kv_info(eager, seq_len, tgt_len)}


def _kv_info(model: nn.Module, seq_len: int, tgt_len: int | None) -> dict:
    """KV-cache bytes per generated token, and per sequence of ``seq_len`` tokens (encoder-decoders: ``tgt_len``
    decoder tokens over ``seq_len`` source tokens)."""
    kv = kv_cache_bytes(model)
    steps = (tgt_len or seq_len) if kv["per_source_token"] else seq_len
    return {"kv_cache_bytes_per_token": kv["per_token"],
            "kv_cache_bytes_per_sequence": kv["per_token"] * steps + kv["per_source_token"] * seq_len}
