"""A second device on a CPU-only machine, so CPU-only CI catches a tensor made on the wrong device.

:func:`on_second_device` moves a model to a fake accelerator: its parameters and buffers become
:class:`OnDevice` tensors, which report ``device`` as ``meta`` (a device every torch build has) but
carry real CPU values, so the model computes real numbers. Inside :class:`SecondDevice`, as on a real
GPU:

- an operation mixing a second-device tensor with a CPU tensor of one element or more raises
  :class:`DeviceMismatch` (CPU 0-dim scalars are allowed, as CUDA allows them); each one is recorded;
- tensors created with ``device=`` that device (``torch.ones(n, device=x.device)``) or moved with
  ``.to(x.device)`` live there; ``.cpu()`` / ``.to("cpu")`` bring them back;
- ``.numpy()`` of a second-device tensor raises, as for a CUDA tensor; ``.tolist()`` / ``.item()`` work.

Code that follows the model's device therefore runs unchanged; a ``torch.ones(n)`` (default: CPU)
that meets the model's tensors fails, as it would on a GPU.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, return_and_correct_aliasing
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("meta")
CROSS_DEVICE = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default, torch.ops.aten.copy.default}
# advanced indexing takes CPU index tensors on any device (as CUDA does): their indices may stay on the CPU
INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default,
            torch.ops.aten._index_put_impl_.default}


class DeviceMismatch(RuntimeError):
    pass


class OnDevice(torch.Tensor):
    """A tensor on the second device: reports ``meta``, holds its real CPU values in ``elem``."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False):
        out = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                  device=DEVICE, requires_grad=requires_grad)
        out.elem = elem
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # outside SecondDevice(): the same rules
        return _run(func, args, kwargs, [])

    def __repr__(self):
        return f"OnDevice({self.elem!r})"


def _wants_second(device) -> bool:
    return device is not None and torch.device(device).type == DEVICE.type


class SecondDevice(TorchDispatchMode):
    """Runs every operation on the CPU values; refuses (and records in ``mismatches``) any that mixes
    the second device with the CPU."""

    def __init__(self):
        super().__init__()
        self.mismatches: list[str] = []
        self._functions = _HostCalls()

    def __enter__(self):
        self._functions.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._functions.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs, self.mismatches)


def _run(func, args, kwargs, mismatches: list[str]):
    kwargs = dict(kwargs or {})
    checked = (args[:1] + args[2:]) if func in INDEXING else args
    tensors = [t for t in tree_flatten((checked, kwargs))[0] if isinstance(t, torch.Tensor)]
    if any(t.device.type == DEVICE.type and not isinstance(t, OnDevice) for t in tensors):
        raise RuntimeError(f"{func}: a tensor made on the second device without values (a path this harness "
                           "does not emulate)")
    on_device = any(isinstance(t, OnDevice) for t in tensors)
    on_cpu = [t for t in tensors if not isinstance(t, OnDevice) and t.dim() > 0 and t.device.type == "cpu"]
    if on_device and on_cpu and func not in CROSS_DEVICE:
        message = f"{func}: second-device tensors mixed with CPU tensors of shapes {[tuple(t.shape) for t in on_cpu]}"
        mismatches.append(message)
        raise DeviceMismatch(message)
    target = kwargs.get("device")
    if _wants_second(target):
        kwargs["device"] = torch.device("cpu")
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    if func is torch.ops.aten.copy_.default:
        return args[0]
    if func is torch.ops.aten._local_scalar_dense.default:
        return out
    wrap = _wants_second(target) or (on_device and target is None)
    out = tree_map(lambda t: OnDevice(t) if wrap and isinstance(t, torch.Tensor) and not isinstance(t, OnDevice)
                   else t, out)
    return return_and_correct_aliasing(func, args, kwargs, out) if on_device else out  # views, in-place ops


def _unwrap(t):
    return t.elem if isinstance(t, OnDevice) else t


class _HostCalls(TorchFunctionMode):
    """``.numpy()`` of a second-device tensor fails as for CUDA; ``.tolist()`` reads its values."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and isinstance(args[0], OnDevice):
            raise TypeError("can't convert a second-device tensor to numpy; use Tensor.cpu() first")
        if func is torch.Tensor.tolist and isinstance(args[0], OnDevice):
            return args[0].elem.tolist()
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], OnDevice):
            index = args[1] if isinstance(args[1], tuple) else (args[1],)  # lists become CPU index tensors
            index = tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)
            args = (args[0], index if isinstance(args[1], tuple) else index[0], *args[2:])
        if func in (torch.tensor, torch.as_tensor, torch.asarray) and _wants_second(kwargs.get("device")):
            return OnDevice(func(*args, **{**kwargs, "device": "cpu"}))  # built from Python data, then moved
        return func(*args, **kwargs)


def on_second_device(model: nn.Module) -> nn.Module:
    """``model`` with every parameter and buffer on the second device (in place; returned)."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and not isinstance(p, OnDevice):
                module._parameters[name] = nn.Parameter(OnDevice(p.detach()), requires_grad=p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None and not isinstance(b, OnDevice):
                module._buffers[name] = OnDevice(b)
    return model
