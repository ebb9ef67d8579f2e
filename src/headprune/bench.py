"""Inference speed of original, pruned and masked models, and the FLOP limit to judge it against.

FLOPs are counted from the model as it is now: one forward of one example (``[1, seq_len]`` tokens;
``[1, tgt_len]`` decoder tokens for encoder-decoders) with a counting hook on every Linear / GPT-2
Conv1D records how many rows (tokens) each one sees, and a Linear costs ``rows * in * out``
multiply-accumulates (MACs). Attention sites add their two products per head, ``QK^T`` and ``AV``:
``2 * heads * head_dim * T_q * T_k`` MACs, with ``T_q`` and ``T_k`` the rows their query and key
projections saw (full ``T x T``, no causal halving). A pruned site has smaller q/k/v/o matrices
and fewer heads; a removed site costs nothing. Embedding lookups, norms, softmax, activations and
other elementwise work are not counted. ``kind="flops"`` is ``2 x MACs``.

Timing: every model gets the same inputs; untimed warm-up calls, then rounds in which each model
runs once, in the order A B, B A, A B, ... (``alternate=True``), so slow drift of the machine hits
all models alike. Each round's time is the mean over ``calls`` forwards (chosen so that a repeat lasts
at least ``min_repeat_s``). Reported: median and quartiles over rounds; the measured speed-up is the
median over rounds of the paired ratio reference time / model time, beside the FLOP limit.
``cpu_s`` / ``measured_cpu`` are the same from process CPU time: a diagnostic that other processes
disturb less than wall-clock time (but OpenMP threads spin while they wait, so it is not pure work).

Memory: the peak growth of the process's resident set during the first (untimed) forward of each
model and batch size (Linux: the high-water mark ``VmHWM`` reset through ``/proc/self/clear_refs``
after glibc ``malloc_trim``), i.e. the activations and workspaces a forward touches, beside the
bytes of parameters and buffers. ``None`` where the platform cannot reset the mark.
"""

from __future__ import annotations

import ctypes
import gc
import inspect
import math
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from .errors import ConfigError
from .report.bench_figures import bench_plot, bench_table
from .selection import lowest_heads
from .sites import find_sites, is_conv1d
from .surgery import original_heads

FLOP_KINDS = ("flops", "macs")
PRUNE_ORDERS = ("index", "random")


# ---------------------------------------------------------------- FLOPs from shapes

def flops_per_example(model: nn.Module, seq_len: int, *, tgt_len: int | None = None, kind: str = "flops") -> int:
    """Matmul FLOPs (``kind="flops"``, 2 per multiply-accumulate) or MACs of one example's forward."""
    return flop_breakdown(model, seq_len, tgt_len=tgt_len, kind=kind)["total"]


def flop_breakdown(model: nn.Module, seq_len: int, *, tgt_len: int | None = None, kind: str = "flops") -> dict[str, int]:
    """{'projections': q/k/v/o of attention sites, 'attention': QK^T and AV, 'other': every other Linear,
    'total'} for one example, in FLOPs or MACs (``kind``)."""
    if kind not in FLOP_KINDS:
        raise ConfigError(f"kind={kind!r}; allowed: {', '.join(map(repr, FLOP_KINDS))}")
    model = _unwrap(model)
    sites = find_sites(model)
    rows: dict[int, int] = {}

    def count(module, args, _out):
        width = module.weight.shape[0] if is_conv1d(module) else module.weight.shape[1]
        rows[id(module)] = rows.get(id(module), 0) + args[0].numel() // width

    linears = {id(m): m for m in model.modules() if isinstance(m, nn.Linear) or is_conv1d(m)}
    handles = [m.register_forward_hook(count) for m in linears.values()]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(**example_inputs(model, 1, seq_len, tgt_len=tgt_len))
    except (IndexError, RuntimeError, ValueError) as e:
        limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
        raise ConfigError(f"seq_len={seq_len}, tgt_len={tgt_len}: the model cannot run one example of this length "
                          f"(max_position_embeddings={limit}): {e}") from None
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    proj: set[int] = set()
    attention = 0
    for s in sites:
        mods = [_linear_of(p.module) for p in (s.q, s.k, s.v)] + [_linear_of(s.o)]
        proj.update(id(m) for m in mods)
        attention += 2 * s.num_heads * s.head_dim * rows.get(id(mods[0]), 0) * rows.get(id(mods[1]), 0)
    macs = {"projections": 0, "other": 0}
    for key, m in linears.items():
        macs["projections" if key in proj else "other"] += rows.get(key, 0) * m.weight.numel()
    macs["attention"] = attention
    scale = 2 if kind == "flops" else 1
    out = {k: scale * v for k, v in macs.items()}
    out["total"] = sum(out.values())
    return out


def _linear_of(module: nn.Module) -> nn.Module:
    return getattr(module, "base", module)  # RepeatHeads computes with its base Linear


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "_orig_mod", model)  # torch.compile wrapper -> the eager module


def example_inputs(model: nn.Module, batch: int, seq_len: int, *, tgt_len: int | None = None,
                   seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids ``[batch, seq_len]`` (no padding), ``decoder_input_ids`` for encoder-decoders."""
    for name, value in (("batch", batch), ("seq_len", seq_len), ("tgt_len", tgt_len)):
        _check_int(name, value, 1, optional=name == "tgt_len")
    model = _unwrap(model)
    config = model.config
    vocab = getattr(config, "vocab_size", None) or model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(seed)
    low = 3 if vocab > 3 else 0  # skip pad/bos/eos of most vocabularies
    ids = torch.randint(low, vocab, (batch, seq_len), generator=g)
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(config, "is_encoder_decoder", False):
        x["decoder_input_ids"] = torch.randint(low, vocab, (batch, tgt_len or seq_len), generator=g)
    if "use_cache" in inspect.signature(model.forward).parameters:
        x["use_cache"] = False  # one forward, nothing to cache
    return x


def fraction_plan(model: nn.Module, fraction: float, *, order: str = "index", seed: int = 0) -> dict[str, list[int]]:
    """Heads to remove, ``fraction`` of all: ``order="index"`` the lowest head indices of every site in
    turn (even: the same count per site, +-1); ``"random"`` a seeded random global choice (uneven)."""
    if order not in PRUNE_ORDERS:
        raise ConfigError(f"order={order!r}; allowed: {', '.join(map(repr, PRUNE_ORDERS))}")
    g = torch.Generator().manual_seed(seed)
    sites = find_sites(model)
    scores = {s.name: torch.arange(s.num_heads, dtype=torch.float32) if order == "index"
              else torch.rand(s.num_heads, generator=g) for s in sites}
    return lowest_heads(scores, fraction=fraction)


# ---------------------------------------------------------------- timing

@dataclass(frozen=True)
class BenchSettings:
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    seq_len: int = 128
    tgt_len: int | None = None  # decoder length of encoder-decoders (None: seq_len)
    warmup: int = 1  # untimed calls per model and batch size (at least 1 when memory=True: it measures memory)
    repeats: int | Mapping[int, int] = 5  # timed rounds per batch size, or {batch size: rounds}
    min_repeat_s: float = 0.2  # forwards per round chosen so one round of the fastest model lasts this long
    alternate: bool = True  # rounds in order A B, B A, ...; False: all of A, then all of B
    memory: bool = True
    seed: int = 0  # of the random token ids

    def __post_init__(self):
        sizes = tuple(self.batch_sizes) if isinstance(self.batch_sizes, Sequence) else ()
        if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
            raise ConfigError(f"batch_sizes={self.batch_sizes!r}; allowed: a non-empty list of integers >= 1")
        object.__setattr__(self, "batch_sizes", sizes)
        _check_int("seq_len", self.seq_len, 1)
        _check_int("tgt_len", self.tgt_len, 1, optional=True)
        _check_int("warmup", self.warmup, 0)
        reps = self.repeats if isinstance(self.repeats, Mapping) else {b: self.repeats for b in sizes}
        for b in sizes:
            _check_int(f"repeats for batch size {b}", reps.get(b), 1)
        if not isinstance(self.min_repeat_s, (int, float)) or not 0 <= self.min_repeat_s < math.inf:
            raise ConfigError(f"min_repeat_s={self.min_repeat_s!r}; allowed: a finite number >= 0")

    def repeats_for(self, batch: int) -> int:
        return self.repeats[batch] if isinstance(self.repeats, Mapping) else self.repeats


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
        """Plain-text table: examples/s (IQR), latency, measured speed-up, FLOP limit, efficiency."""
        return bench_table(self)

    def plot(self, path: str | Path) -> Path:
        """PNG: examples/s vs batch size per model (IQR bars); measured speed-up vs FLOP limit."""
        return bench_plot(self, path)


def benchmark(models: Mapping[str, nn.Module], *, batch_sizes: Sequence[int] = (1, 4, 16, 64), seq_len: int = 128,
              tgt_len: int | None = None, warmup: int = 1, repeats: int | Mapping[int, int] = 5,
              min_repeat_s: float = 0.2, alternate: bool = True, memory: bool = True, seed: int = 0,
              reference: str | Mapping[str, str] | None = None, progress: bool = False) -> BenchResult:
    """Examples/s, latency and memory of ``models`` ({name: model}) at every batch size, with speed-ups.

    ``reference``: the model every other one is compared with (default: the first), or
    {model: its reference} (models not named there have none). Models run in eval mode under
    ``torch.inference_mode`` and are restored to their mode afterwards.
    """
    from .tasks.base import versions

    settings = BenchSettings(tuple(batch_sizes) if isinstance(batch_sizes, Sequence) else batch_sizes, seq_len,
                             tgt_len, warmup, repeats, min_repeat_s, alternate, memory, seed)
    if not isinstance(models, Mapping) or not models:
        raise ConfigError("models: expected a non-empty mapping name -> model")
    for name, m in models.items():
        if not isinstance(name, str) or not isinstance(m, nn.Module):
            raise ConfigError(f"models[{name!r}]: expected a string name and an nn.Module, got {type(m).__name__}")
    refs = _references(list(models), reference)
    start, load_start = time.perf_counter(), _loadavg()
    info = {name: model_info(m, seq_len, tgt_len) for name, m in models.items()}
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
                     "flop_kind": "FLOPs = 2 x multiply-accumulates of matmuls (Linear + QK^T + AV)"}
    machine = {**machine_info(), "loadavg_start": load_start, "loadavg_end": _loadavg()}
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
    inputs = {n: example_inputs(models[n], batch, s.seq_len, tgt_len=s.tgt_len, seed=s.seed) for n in names}
    mem: dict[str, int | None] = {n: None for n in names}
    first: dict[str, float] = {}
    with torch.inference_mode():
        for i in range(max(s.warmup, 1 if s.memory else 0)):
            for n in names:
                if i == 0 and s.memory:
                    mem[n], (first[n], _) = _peak_rss_delta(lambda n=n: _time(models[n], inputs[n], 1))
                else:
                    first[n], _ = _time(models[n], inputs[n], 1)
        fastest = min(first.values(), default=0.0)
        calls = max(1, math.ceil(s.min_repeat_s / fastest)) if fastest > 0 else 1
        rounds = s.repeats_for(batch)
        order = ([names if r % 2 == 0 else names[::-1] for r in range(rounds)] if s.alternate
                 else [[n] * rounds for n in names])
        for n in names:
            times[(n, batch)] = {"wall": [], "cpu": []}
        for step in order:
            for n in step:
                wall, cpu = _time(models[n], inputs[n], calls)
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
                    "examples_per_s_q75": batch / q25, "peak_rss_delta_bytes": mem[n], "seconds": t})
    return out


def _time(model: nn.Module, inputs: dict, calls: int) -> tuple[float, float]:
    """(wall-clock, process CPU) seconds of one forward, means over ``calls`` (garbage collection paused)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            model(**inputs)
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
    return {"model": name, "reference": ref, "batch": batch, "measured": measured, "measured_q25": q25,
            "measured_q75": q75, "ratio_of_medians": statistics.median(ref_t["wall"])
            / statistics.median(t["wall"]), "measured_cpu": statistics.median(paired_cpu),
            "flop_limit": limit, "efficiency": eff}


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def _check_int(name: str, value, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r}; allowed: an integer >= {minimum}")


# ---------------------------------------------------------------- model, machine, memory

def model_info(model: nn.Module, seq_len: int, tgt_len: int | None = None) -> dict:
    """Parameters, bytes, heads and FLOPs per example of ``model`` (FLOPs at ``seq_len``/``tgt_len``)."""
    eager = _unwrap(model)
    params = list(eager.parameters())
    sites = find_sites(eager)
    breakdown = flop_breakdown(eager, seq_len, tgt_len=tgt_len)
    return {"class": type(eager).__name__, "compiled": eager is not model,
            "dtype": str(params[0].dtype) if params else None,
            "attn_implementation": getattr(eager.config, "_attn_implementation", None),
            "params": sum(p.numel() for p in params),
            "param_bytes": sum(p.numel() * p.element_size() for p in params)
            + sum(b.numel() * b.element_size() for b in eager.buffers()),
            "sites": len(sites), "heads": sum(s.num_heads for s in sites),
            "heads_original": sum(original_heads(eager).values()),
            "masked": bool(getattr(eager, "_headprune_mask_handles", None)),
            "flops_per_example": breakdown["total"], "flops_breakdown": breakdown}


def machine_info() -> dict:
    """CPU, threads and platform: enough to tell whether two timings are comparable."""
    processor = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            processor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), processor)
    except OSError:
        pass
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"platform": platform.platform(), "machine": platform.machine(), "processor": processor or "unknown",
            "cpu_count": os.cpu_count(), "cpus_usable": affinity, "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "mkldnn": torch.backends.mkldnn.is_available()}


def _loadavg() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _peak_rss_delta(fn) -> tuple[int | None, float]:
    """(peak resident-set growth in bytes while ``fn`` runs, or None; ``fn``'s return value)."""
    try:
        libc = ctypes.CDLL(None)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)  # give freed heap pages back, so reused pages do not hide the peak
        before = _status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        return None, fn()
    value = fn()
    peak = _status_bytes("VmHWM")
    return (max(0, peak - before) if peak is not None and before is not None else None), value


def _status_bytes(key: str) -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None
