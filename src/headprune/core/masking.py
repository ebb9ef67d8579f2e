"""The reversible stage: head mask variables xi_h, applied without touching the model's code.

A mask maps site name -> float tensor ``[num_heads]`` (one value per head) or ``[batch, num_heads]``
(one per example and head, used for exact per-example gradients). Masking a site registers a
forward pre-hook on its output projection that scales each head's slice of the projection's input
``[..., num_heads * head_dim]`` by xi: this is the paper's ``sum_h xi_h Att_h(x)``, whatever
attention implementation (eager, sdpa, flash) computed the heads. A head with xi = 0 contributes
nothing; a site with all heads at 0 contributes only its output bias. Sites missing from the mask
are left alone, so an all-ones mask and no mask give bit-identical outputs.

Masks compose, like :mod:`torch.nn.utils.prune`'s containers: a model holds a stack of masks and
computes with their product. ``with masked(model, a): with masked(model, b): ...`` runs with
``a * b`` inside and with ``a`` again after the inner block; scoring inside a user's ``masked()``
block adds its own mask on top and leaves the user's in place. :func:`mask_heads` replaces the
whole stack with one mask (until :func:`unmask_heads`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from ..errors import MaskError, SiteError
from .devices import module_device
from .sites import Site, find_sites

HeadMask = dict[str, torch.Tensor]  # site name -> [num_heads] or [batch, num_heads]

_HANDLES = "_headprune_mask_handles"  # hooks on the output projections
_STACK = "_headprune_mask_stack"  # [(token, validated mask)], innermost last


def ones_mask(model_or_sites: nn.Module | list[Site], batch: int | None = None, *,
              requires_grad: bool = False, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> HeadMask:
    """A mask of ones for every site: ``[num_heads]`` each, or ``[batch, num_heads]``; on ``device``, by
    default each site's own (its output projection's, so a model spread by a ``device_map`` works too)."""
    sites = model_or_sites if isinstance(model_or_sites, list) else find_sites(model_or_sites)
    shape = (lambda s: (s.num_heads,)) if batch is None else (lambda s: (batch, s.num_heads))
    return {s.name: torch.ones(shape(s), dtype=dtype, requires_grad=requires_grad,
                               device=device if device is not None else module_device(s.o)) for s in sites}


def mask_from_heads(model_or_sites: nn.Module | list[Site], heads: Mapping[str, list[int]]) -> HeadMask:
    """A [num_heads] mask with zeros at the given heads ({site: head indices}) and ones elsewhere."""
    sites = model_or_sites if isinstance(model_or_sites, list) else find_sites(model_or_sites)
    by_name = {s.name: s for s in sites}
    mask = ones_mask(sites)
    for name, idx in heads.items():
        site = _site(by_name, name, "heads")
        for h in idx:
            if not isinstance(h, int) or isinstance(h, bool) or not 0 <= h < site.num_heads:
                raise MaskError(f"heads[{name!r}]: head index {h!r} out of range; allowed 0..{site.num_heads - 1}")
            mask[name][h] = 0.0
    return mask


def validate_mask(sites: list[Site], mask: Mapping[str, object]) -> HeadMask:
    """Check names, shapes and values; return the mask as float tensors (no copy when already one)."""
    if not isinstance(mask, Mapping):
        raise MaskError(f"mask must be a mapping site name -> tensor, got {type(mask).__name__}")
    by_name = {s.name: s for s in sites}
    out: HeadMask = {}
    batch = None
    for name, value in mask.items():
        site = _site(by_name, name, "mask")
        xi = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float32)
        if not xi.is_floating_point():
            xi = xi.to(torch.float32)
        if xi.dim() not in (1, 2) or xi.shape[-1] != site.num_heads:
            raise MaskError(f"mask[{name!r}] has shape {tuple(xi.shape)}; allowed: ({site.num_heads},) or "
                            f"(batch, {site.num_heads})")
        if xi.dim() == 2:
            if batch is not None and xi.shape[0] != batch:
                raise MaskError(f"mask[{name!r}] has batch {xi.shape[0]} but another site has batch {batch}")
            batch = xi.shape[0]
        if not bool(torch.isfinite(xi.detach()).all()):
            raise MaskError(f"mask[{name!r}] has non-finite values; allowed: finite floats")
        out[name] = xi
    return out


def mask_heads(model: nn.Module, mask: Mapping[str, object]) -> None:
    """Apply ``mask`` to ``model`` until :func:`unmask_heads` (replacing any mask already applied)."""
    sites = find_sites(model)
    checked = validate_mask(sites, mask)
    _install(model, sites, [(object(), checked)])


def unmask_heads(model: nn.Module) -> None:
    """Remove every mask of ``model`` (no-op when none is applied)."""
    _remove_hooks(model)
    if hasattr(model, _STACK):
        delattr(model, _STACK)


def is_masked(model: nn.Module) -> bool:
    return bool(getattr(model, _STACK, None))


def active_masks(model: nn.Module) -> list[HeadMask]:
    """The masks applied to ``model``, outermost first (the model computes with their product)."""
    return [mask for _, mask in getattr(model, _STACK, [])]


@contextmanager
def masked(model: nn.Module, mask: Mapping[str, object]) -> Iterator[nn.Module]:
    """``with masked(model, mask): ...`` runs the model with ``mask`` times any mask already applied,
    and restores exactly the masks that were applied before on exit."""
    sites = find_sites(model)
    checked = validate_mask(sites, mask)
    stack = list(getattr(model, _STACK, []))
    _check_batches(stack, checked)
    token = object()
    _install(model, sites, stack + [(token, checked)])
    try:
        yield model
    finally:
        left = [entry for entry in getattr(model, _STACK, []) if entry[0] is not token]
        if left:
            _install(model, find_sites(model), left)
        else:
            unmask_heads(model)


def _check_batches(stack: list, mask: HeadMask) -> None:
    """Batched masks of different entries must agree on the batch size."""
    sizes = {t.shape[0] for _, m in stack for t in m.values() if t.dim() == 2}
    new = {t.shape[0] for t in mask.values() if t.dim() == 2}
    if sizes and new and sizes != new:
        raise MaskError(f"mask has batch {sorted(new)[0]} but a mask applied around it has batch {sorted(sizes)[0]}")


def _install(model: nn.Module, sites: list[Site], stack: list) -> None:
    """Hooks that scale each site's heads by the product of its entries in ``stack``."""
    _remove_hooks(model)
    handles = []
    for site in sites:
        factors = [m[site.name] for _, m in stack if site.name in m]
        if factors:
            handles.append(site.o.register_forward_pre_hook(_ScaleHeads(factors, site.num_heads, site.head_dim)))
    setattr(model, _HANDLES, handles)
    setattr(model, _STACK, stack)


def _remove_hooks(model: nn.Module) -> None:
    for handle in getattr(model, _HANDLES, []):
        handle.remove()
    if hasattr(model, _HANDLES):
        delattr(model, _HANDLES)


class _ScaleHeads:
    """Forward pre-hook: x [..., H * hd] -> x with head h's slice scaled by the product of the
    factors' xi[h] (or xi[b, h]); computed at call time, so gradients reach every factor."""

    def __init__(self, factors: list[torch.Tensor], num_heads: int, head_dim: int):
        self.factors, self.num_heads, self.head_dim = factors, num_heads, head_dim

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        x = args[0]  # [batch, ..., H * hd]
        xi = self.factors[0].to(dtype=x.dtype, device=x.device)
        for factor in self.factors[1:]:
            xi = xi * factor.to(dtype=x.dtype, device=x.device)  # [H] or [B, H]
        if xi.dim() == 2:
            if xi.shape[0] != x.shape[0]:
                raise MaskError(f"mask batch {xi.shape[0]} does not match the input batch {x.shape[0]}")
            xi = xi.view(xi.shape[0], *([1] * (x.dim() - 2)), self.num_heads)  # [B, 1.., H]
        heads = x.unflatten(-1, (self.num_heads, self.head_dim))  # [..., H, hd]
        return (heads * xi.unsqueeze(-1)).flatten(-2), *args[1:]


def _site(by_name: dict[str, Site], name: str, argument: str) -> Site:
    if name not in by_name:
        raise SiteError(f"{argument}: unknown site {name!r}; allowed: {', '.join(by_name) or '(none)'}")
    return by_name[name]

