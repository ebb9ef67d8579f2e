"""The machine a timing ran on, and the memory a forward touches.

Memory: the peak growth of the process's resident set while a function runs (Linux: the high-water
mark ``VmHWM`` reset through ``/proc/self/clear_refs`` after glibc ``malloc_trim``), i.e. the
activations and workspaces a forward touches. ``None`` where the platform cannot reset the mark.
"""

from __future__ import annotations

import ctypes
import os
import platform

import torch


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


def loadavg() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def peak_rss_delta(fn) -> tuple[int | None, float]:
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
