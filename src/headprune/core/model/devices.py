"""Where tensors go: every tensor headprune makes follows the model's device (or the site's, when a
``device_map`` spreads the model over several), never the process's default.

Scores are accumulated in float64 on the device and moved to the CPU once at the end
(:func:`accumulator_device`: devices without float64, such as Apple's ``mps``, accumulate on the CPU).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from torch import nn

from ...errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); CPU for a model without either."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def module_device(module: nn.Module, default: torch.device | None = None) -> torch.device:
    """The device of ``module``'s own first parameter (a site's output projection), else ``default`` or CPU."""
    for tensor in module.parameters():
        return tensor.device
    return default or torch.device("cpu")


def input_device(model: nn.Module) -> torch.device:
    """Where a batch goes: the input embeddings' device (the first block's under a ``device_map``)."""
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embeddings = None
    return module_device(embeddings, model_device(model)) if embeddings is not None else model_device(model)


def to_device(batch: Mapping[str, object], device: torch.device | str) -> dict:
    """``batch`` with every tensor moved to ``device`` (non-blocking from pinned memory; others untouched)."""
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def accumulator_device(device: torch.device | str) -> torch.device:
    """Where float64 sums live: ``device`` itself, or the CPU for devices without float64 (mps)."""
    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device


def best_device() -> str:
    """``cuda`` (``cuda:LOCAL_RANK`` under torchrun) when a CUDA (or ROCm) GPU is visible, else ``mps`` on Apple silicon, else ``cpu``."""
    if torch.cuda.is_available():  # under torchrun: this process's own GPU
        local = os.environ.get("LOCAL_RANK")
        return f"cuda:{int(local) % torch.cuda.device_count()}" if local is not None else "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def resolve_device(name: str | None, flag: str = "--device") -> torch.device:
    """``cpu``, ``cuda``, ``cuda:1``, ``mps`` (None: :func:`best_device`), checked to exist here."""
    value = best_device() if name is None else str(name).strip()
    allowed = "cpu, cuda, cuda:N, mps"
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{flag} {name!r}; allowed: {allowed}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{flag} {name!r}: no CUDA device here (torch {torch.__version__}); allowed: cpu"
                              + (", mps" if best_device() == "mps" else ""))
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{flag} {name!r}: this machine has {count} CUDA device(s); allowed: cuda:0.."
                              f"cuda:{count - 1}")
    elif device.type == "mps":
        if best_device() != "mps":
            raise ConfigError(f"{flag} {name!r}: no Apple mps device here; allowed: {best_device()}, cpu")
    elif device.type != "cpu":
        raise ConfigError(f"{flag} {name!r}; allowed: {allowed}")
    return device


def resolve_dtype(name: str | None, flag: str = "--dtype") -> torch.dtype | None:
    """``float32``, ``bfloat16``, ``float16`` as a torch dtype; None keeps the dtype the model was saved in."""
    if name is None:
        return None
    if name not in DTYPES:
        raise ConfigError(f"{flag} {name!r}; allowed: {', '.join(DTYPES)}")
    return DTYPES[name]


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA, mps), so a timer measures the work and not its launch."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def peak_device_bytes(fn, device: torch.device | str):
    """(peak CUDA memory allocated above what was allocated before, in bytes, while ``fn`` runs, or None
    off CUDA; ``fn``'s return value)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, fn()
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    value = fn()
    synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - before), value
