"""The reversible stage: unit masks, applied without touching the model's code.

A *unit* is a slice of the input of one linear layer: an attention head is ``head_dim`` wide features
of its site's output projection input ``[..., num_heads * head_dim]``; an FFN neuron is one feature of its
down projection's input ``[..., width]``. One mechanism masks both: a forward pre-hook on that projection
scales each unit's slice by xi. For heads this is the paper's ``sum_h xi_h Att_h(x)``, whatever attention
implementation (eager, sdpa, flash) computed the heads. A unit with xi = 0 contributes nothing. Sites or
FFNs missing from a mask are left alone, so an all-ones mask and no mask give bit-identical outputs.

A head mask maps site name -> float tensor ``[num_heads]`` or ``[batch, num_heads]`` (one row per example,
for exact per-example gradients); a neuron mask maps FFN name -> ``[width]`` or ``[batch, width]``.

Masks compose, like :mod:`torch.nn.utils.prune`'s containers: a model holds one stack of masks (heads and
neurons) and computes with their product. ``with masked(model, a): with masked(model, b): ...`` runs with
``a * b`` inside and with ``a`` again after the inner block; ``masked_neurons`` stacks the same way, and
scoring inside a user's block adds its own mask on top and leaves the user's in place. :func:`mask_heads`
replaces every head mask with one (until :func:`unmask_heads`). Surgery refuses a model with any mask on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...errors import MaskError, SiteError
from ..model.devices import module_device
from ..model.ffn import FFN, find_ffns
from ..model.sites import Site, find_sites

HeadMask = dict[str, torch.Tensor]  # site name -> [num_heads] or [batch, num_heads]
NeuronMask = dict[str, torch.Tensor]  # ffn name -> [width] or [batch, width]

_HANDLES = "_headprune_mask_handles"  # hooks on the projections
_STACK = "_headprune_mask_stack"  # [(token, kind name, validated mask)], innermost last


@dataclass(frozen=True)
class UnitKind:
    """What a kind of unit is: where its groups are found, how many units a group has, how wide a unit's
    slice of the masked projection's input is, and which projection the mask scales."""

    name: str  # "heads" | "neurons"
    group: str  # what holds the units: "site" | "ffn"
    label: str  # how a mask of this kind is called in messages
    find: Callable[[nn.Module], list]
    count: Callable[[Any], int]  # of a Site or an FFN
    width: Callable[[Any], int]
    target: Callable[[Any], nn.Module]


HEADS = UnitKind("heads", "site", "mask", find_sites, lambda s: s.num_heads, lambda s: s.head_dim, lambda s: s.o)
NEURONS = UnitKind("neurons", "ffn", "neuron mask", find_ffns, lambda f: f.width, lambda f: 1, lambda f: f.down)
KINDS = {k.name: k for k in (HEADS, NEURONS)}


# ---------------------------------------------------------------- building and checking masks

def ones_mask(model_or_sites: nn.Module | list[Site], batch: int | None = None, *,
              requires_grad: bool = False, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> HeadMask:
    """A mask of ones for every site: ``[num_heads]`` each, or ``[batch, num_heads]``; on ``device``, by
    default each site's own (its output projection's, so a model spread by a ``device_map`` works too)."""
    return _ones(HEADS, model_or_sites, batch, requires_grad=requires_grad, dtype=dtype, device=device)


def neuron_ones(model_or_ffns: nn.Module | list[FFN], batch: int | None = None, *,
                requires_grad: bool = False) -> NeuronMask:
    """A mask of ones for every FFN: ``[width]`` each, or ``[batch, width]``."""
    return _ones(NEURONS, model_or_ffns, batch, requires_grad=requires_grad)


def _ones(kind: UnitKind, model_or_units, batch: int | None, *, requires_grad: bool,
          dtype: torch.dtype = torch.float32, device=None) -> dict[str, torch.Tensor]:
    units = model_or_units if isinstance(model_or_units, list) else kind.find(model_or_units)
    return {u.name: torch.ones((kind.count(u),) if batch is None else (batch, kind.count(u)), dtype=dtype,
                               requires_grad=requires_grad,
                               device=device if device is not None else module_device(kind.target(u)))
            for u in units}


def mask_from_heads(model_or_sites: nn.Module | list[Site], heads: Mapping[str, list[int]]) -> HeadMask:
    """A [num_heads] mask with zeros at the given heads ({site: head indices}) and ones elsewhere."""
    return _mask_from(HEADS, model_or_sites, heads, "heads")


def neuron_mask_from(model: nn.Module, dropped: Mapping[str, Iterable[int]]) -> NeuronMask:
    """A [width] mask with zeros at ``dropped`` ({ffn: neuron indices}) and ones elsewhere."""
    return _mask_from(NEURONS, model, dropped, "neurons")


def _mask_from(kind: UnitKind, model_or_units, zeros: Mapping[str, Iterable[int]], argument: str) -> dict:
    units = model_or_units if isinstance(model_or_units, list) else kind.find(model_or_units)
    by_name = {u.name: u for u in units}
    mask = _ones(kind, units, None, requires_grad=False)
    for name, idx in zeros.items():
        unit = find_unit(kind, by_name, name, argument)
        mask[name][unit_indices(kind, argument, name, idx, kind.count(unit))] = 0.0
    return mask


def unit_indices(kind: UnitKind, argument: str, name: str, idx: Iterable[int], n: int,
                 error: type = MaskError) -> list[int]:
    """``idx`` as a list of ints in ``0..n-1`` (tensors of one element accepted), else ``error`` naming it."""
    noun = kind.name[:-1]
    if isinstance(idx, (str, bytes)) or not isinstance(idx, Iterable):
        raise error(f"{argument}[{name!r}] must be a list of {noun} indices, got {idx!r}")
    out = []
    for i in (idx.tolist() if isinstance(idx, torch.Tensor) else idx):
        i = int(i) if isinstance(i, torch.Tensor) and i.numel() == 1 else i
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise error(f"{argument}[{name!r}]: {noun} index {i!r} out of range; allowed: integers 0..{n - 1}")
        out.append(i)
    return out


def find_unit(kind: UnitKind, by_name: Mapping[str, object], name: str, argument: str):
    if name not in by_name:
        raise SiteError(f"{argument}: unknown {kind.group} {name!r}; allowed: {', '.join(by_name) or '(none)'}")
    return by_name[name]


def validate_mask(sites: list[Site], mask: Mapping[str, object]) -> HeadMask:
    """Check names, shapes and values; return the mask as float tensors (no copy when already one)."""
    return validate_units(HEADS, sites, mask)


def validate_units(kind: UnitKind, units: list, mask: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """One set of checks for every kind: known names, ``[n]`` or ``[batch, n]`` with one batch, finite floats."""
    if not isinstance(mask, Mapping):
        raise MaskError(f"{kind.label} must be a mapping {kind.group} name -> tensor, got {type(mask).__name__}")
    by_name = {u.name: u for u in units}
    out: dict[str, torch.Tensor] = {}
    batch = None
    for name, value in mask.items():
        n = kind.count(find_unit(kind, by_name, name, kind.label))
        xi = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float32)
        if not xi.is_floating_point():
            xi = xi.to(torch.float32)
        if xi.dim() not in (1, 2) or xi.shape[-1] != n:
            raise MaskError(f"{kind.label}[{name!r}] has shape {tuple(xi.shape)}; allowed: ({n},) or (batch, {n})")
        if xi.dim() == 2:
            if batch is not None and xi.shape[0] != batch:
                raise MaskError(f"{kind.label}[{name!r}] has batch {xi.shape[0]} but another {kind.group} has "
                                f"batch {batch}")
            batch = xi.shape[0]
        if not bool(torch.isfinite(xi.detach()).all()):
            raise MaskError(f"{kind.label}[{name!r}] has non-finite values; allowed: finite floats")
        out[name] = xi
    return out


# ---------------------------------------------------------------- applying masks

def mask_heads(model: nn.Module, mask: Mapping[str, object]) -> None:
    """Apply ``mask`` to ``model`` until :func:`unmask_heads` (replacing any head mask already applied)."""
    checked = validate_mask(find_sites(model), mask)
    others = [entry for entry in _stack(model) if entry[1] != HEADS.name]
    _check_batches(others, checked)
    _install(model, others + [(object(), HEADS.name, checked)])


def unmask_heads(model: nn.Module) -> None:
    """Remove every head mask of ``model`` (no-op when none is applied); neuron masks stay."""
    _install(model, [entry for entry in _stack(model) if entry[1] != HEADS.name])


def is_masked(model: nn.Module) -> bool:
    """Whether a head mask is applied."""
    return any(kind == HEADS.name for _, kind, _ in _stack(model))


def active_masks(model: nn.Module) -> list[HeadMask]:
    """The head masks applied to ``model``, outermost first (the model computes with their product)."""
    return [mask for _, kind, mask in _stack(model) if kind == HEADS.name]


def masked_kinds(model: nn.Module) -> list[str]:
    """The kinds of unit with a mask applied (``"heads"``, ``"neurons"``), in stack order without repeats."""
    return list(dict.fromkeys(kind for _, kind, _ in _stack(model)))


@contextmanager
def masked(model: nn.Module, mask: Mapping[str, object]) -> Iterator[nn.Module]:
    """``with masked(model, mask): ...`` runs the model with ``mask`` times any mask already applied,
    and restores exactly the masks that were applied before on exit."""
    with _masked(model, HEADS, mask):
        yield model


@contextmanager
def masked_neurons(model: nn.Module, mask: Mapping[str, object]) -> Iterator[nn.Module]:
    """``with masked_neurons(model, mask):`` runs ``model`` with its FFN neurons scaled by ``mask`` (times any
    neuron mask already applied); restores the masks applied before on exit."""
    with _masked(model, NEURONS, mask):
        yield model


@contextmanager
def _masked(model: nn.Module, kind: UnitKind, mask: Mapping[str, object]) -> Iterator[None]:
    checked = validate_units(kind, kind.find(model), mask)
    stack = _stack(model)
    _check_batches(stack, checked)
    token = object()
    _install(model, stack + [(token, kind.name, checked)])
    try:
        yield
    finally:
        _install(model, [entry for entry in _stack(model) if entry[0] is not token])


@contextmanager
def row_of_masks(model: nn.Module, row: int) -> Iterator[nn.Module]:
    """Inside, every batched mask applied to ``model`` (``[B, n]``) scales by its row ``row`` only (``[1, n]``):
    ``model`` then runs example ``row`` of the batch alone, masked as it is in the batch. Restored on exit."""
    stack = _stack(model)
    if not any(t.dim() == 2 for _, _, m in stack for t in m.values()):
        yield model
        return
    _install(model, [(token, name, {k: t[row:row + 1] if t.dim() == 2 else t for k, t in m.items()})
                     for token, name, m in stack])
    try:
        yield model
    finally:
        _install(model, stack)


def _stack(model: nn.Module) -> list:
    return list(getattr(model, _STACK, []))


def _check_batches(stack: list, mask: dict) -> None:
    """Batched masks of different entries must agree on the batch size (they scale the same inputs)."""
    sizes = {t.shape[0] for _, _, m in stack for t in m.values() if t.dim() == 2}
    new = {t.shape[0] for t in mask.values() if t.dim() == 2}
    if sizes and new and sizes != new:
        raise MaskError(f"mask has batch {sorted(new)[0]} but a mask applied around it has batch {sorted(sizes)[0]}")


def _install(model: nn.Module, stack: list) -> None:
    """Hooks that scale each unit by the product of its entries in ``stack`` (none when it is empty)."""
    for handle in getattr(model, _HANDLES, []):
        handle.remove()
    for attr in (_HANDLES, _STACK):
        if hasattr(model, attr):
            delattr(model, attr)
    if not stack:
        return
    handles = []
    for kind in KINDS.values():
        entries = [m for _, name, m in stack if name == kind.name]
        if not entries:
            continue
        for unit in kind.find(model):
            factors = [m[unit.name] for m in entries if unit.name in m]
            if factors:
                scale = _ScaleUnits(factors, kind.count(unit), kind.width(unit), kind.label)
                handles.append(kind.target(unit).register_forward_pre_hook(scale))
    setattr(model, _HANDLES, handles)
    setattr(model, _STACK, stack)


class _ScaleUnits:
    """Forward pre-hook: x [..., n * width] -> x with unit u's slice scaled by the product of the factors'
    xi[u] (or xi[b, u]); computed at call time, so gradients reach every factor."""

    def __init__(self, factors: list[torch.Tensor], count: int, width: int, label: str = "mask"):
        self.factors, self.count, self.width, self.label = factors, count, width, label

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        x = args[0]  # [batch, ..., n * width]
        xi = self.factors[0].to(dtype=x.dtype, device=x.device)
        for factor in self.factors[1:]:
            xi = xi * factor.to(dtype=x.dtype, device=x.device)  # [n] or [B, n]
        if xi.dim() == 2:
            if xi.shape[0] != x.shape[0]:
                raise MaskError(f"{self.label} batch {xi.shape[0]} does not match the input batch {x.shape[0]}")
            xi = xi.view(xi.shape[0], *([1] * (x.dim() - 2)), self.count)  # [B, 1.., n]
        if self.width == 1:
            return x * xi, *args[1:]
        units = x.unflatten(-1, (self.count, self.width))  # [..., n, width]
        return (units * xi.unsqueeze(-1)).flatten(-2), *args[1:]
