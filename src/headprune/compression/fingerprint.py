"""The fingerprint of a model: what a :class:`~.replay.Plan` checks before it is replayed on a model.

``fingerprint(model)`` holds the model's class, its config (``config.to_dict()`` without the keys that say where
and how it was loaded: ``_name_or_path``, other ``_``-keys, ``transformers_version``, ``headprune_version``, ``dtype`` / ``torch_dtype``),
the dtypes of its tensors, and a SHA-256 of every tensor of its state dict: over the key, the dtype, the shape and
every byte of the tensor (no sampling), with an overall SHA-256 over ``key:digest`` lines in sorted key order.
A tied tensor is hashed once. Full hashing reads each tensor once (on the CPU, one tensor at a time): about a
second per GB of weights, a few seconds for a 1B model.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from ..core.model.records import VERSION_KEY
from ..errors import PlanError

# how it was saved and loaded (the tensors' dtypes say the rest)
LOADING_KEYS = frozenset({"transformers_version", VERSION_KEY, "dtype", "torch_dtype"})


def bytes_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of every byte of ``tensor``'s data (read on the CPU)."""
    h = hashlib.sha256()
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel():
        h.update(flat.view(torch.uint8).numpy().data)
    return h.hexdigest()


def tensor_digest(key: str, tensor: torch.Tensor, data: str | None = None) -> str:
    """SHA-256 of ``key``, ``tensor``'s dtype and shape and :func:`bytes_digest` (``data``, when known)."""
    data = bytes_digest(tensor) if data is None else data
    return hashlib.sha256(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|{data}".encode()).hexdigest()


def tensor_digests(model: nn.Module) -> dict[str, str]:
    """{state-dict key: :func:`tensor_digest`}; the bytes of tied tensors are read once."""
    data: dict[tuple, str] = {}  # (data pointer, dtype, shape): SHA-256 of the bytes
    out = {}
    for key, tensor in model.state_dict().items():
        shared = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if shared not in data:
            data[shared] = bytes_digest(tensor)
        out[key] = tensor_digest(key, tensor, data[shared])
    return out


def _config(value):
    if isinstance(value, dict):
        return {str(k): _config(v) for k, v in value.items() if not str(k).startswith("_") and k not in LOADING_KEYS}
    if isinstance(value, (list, tuple)):
        return [_config(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def fingerprint(model: nn.Module) -> dict:
    """{class, config, dtypes, sha256, tensors: {key: sha256}} of ``model`` (JSON-ready; see the module doc)."""
    config = getattr(model, "config", None)
    digests = tensor_digests(model)
    overall = hashlib.sha256("".join(f"{k}:{digests[k]}\n" for k in sorted(digests)).encode()).hexdigest()
    return {"class": type(model).__name__, "config": _config(config.to_dict()) if config is not None else None,
            "dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in model.state_dict().values()}),
            "sha256": overall, "tensors": digests}


def check_fingerprint(model: nn.Module, expected: dict) -> None:
    """Refuse (:class:`PlanError`, one line) ``model`` unless its :func:`fingerprint` is ``expected``: the class,
    the config, the dtypes and every tensor's bytes; the message names what differs."""
    found = fingerprint(model)
    if found["sha256"] == expected.get("sha256") and found["class"] == expected.get("class") and \
            found["config"] == expected.get("config"):
        return
    if found["class"] != expected.get("class"):
        what = f"class {found['class']}, the plan's {expected.get('class')}"
    elif found["config"] != expected.get("config"):
        a, b = found["config"] or {}, expected.get("config") or {}
        keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        what = f"config differs at {', '.join(keys[:3])}{f' and {len(keys) - 3} more' if len(keys) > 3 else ''}"
    elif found["dtypes"] != expected.get("dtypes"):
        what = f"dtypes {', '.join(found['dtypes'])}, the plan's {', '.join(expected.get('dtypes') or [])}"
    else:
        a, b = found["tensors"], expected.get("tensors") or {}
        keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        what = f"weights differ at {', '.join(keys[:2])}{f' and {len(keys) - 2} more' if len(keys) > 2 else ''}"
    raise PlanError(f"model: fingerprint mismatch ({what}; sha256 {found['sha256'][:12]}, the plan's "
                    f"{str(expected.get('sha256'))[:12]}); allowed: the model the plan was made on, loaded with the "
                    "same dtype")
