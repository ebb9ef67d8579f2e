"""The reversible stage: head mask variables xi_h, applied without touching the model's code.

A mask maps site name -> float tensor ``[num_heads]`` (one value per head) or ``[batch, num_heads]``
(one per example and head, used for exact per-example gradients). Masking a site registers a
forward pre-hook on its output projection that scales each head's slice of the projection's input
``[..., num_heads * head_dim]`` by xi: this is the paper's ``sum_h xi_h Att_h(x)``, whatever
attention implementation (eager, sdpa, flash) computed the heads. A head with xi = 0 contributes
nothing; a site with all heads at 0 contributes only its output bias. Sites missing from the mask
are left alone, so an all-ones mask and no mask give bit-identical outputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from .errors import MaskError, SiteError
from .sites import Site, find_sites

HeadMask = dict[str, torch.Tensor]  # site name -> [num_heads] or [batch, num_heads]

_HANDLES = "_headprune_mask_handles"


def ones_mask(model_or_sites: nn.Module | list[Site], batch: int | None = None, *,
              requires_grad: bool = False, dtype: torch.dtype = torch.float32) -> HeadMask:
    """A mask of ones for every site: ``[num_heads]`` each, or ``[batch, num_heads]``."""
    sites = model_or_sites if isinstance(model_or_sites, list) else find_sites(model_or_sites)
    shape = (lambda s: (s.num_heads,)) if batch is None else (lambda s: (batch, s.num_heads))
    return {s.name: torch.ones(shape(s), dtype=dtype, requires_grad=requires_grad) for s in sites}


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
    unmask_heads(model)
    handles = []
    for site in sites:
        if site.name in checked:
            hook = _ScaleHeads(checked[site.name], site.num_heads, site.head_dim)
            handles.append(site.o.register_forward_pre_hook(hook))
    setattr(model, _HANDLES, handles)


def unmask_heads(model: nn.Module) -> None:
    """Remove the mask of ``model`` (no-op when none is applied)."""
    for handle in getattr(model, _HANDLES, []):
        handle.remove()
    if hasattr(model, _HANDLES):
        delattr(model, _HANDLES)


def is_masked(model: nn.Module) -> bool:
    return bool(getattr(model, _HANDLES, None))


@contextmanager
def masked(model: nn.Module, mask: Mapping[str, object]) -> Iterator[nn.Module]:
    """``with masked(model, mask): ...`` runs the model with the mask, and restores it afterwards."""
    mask_heads(model, mask)
    try:
        yield model
    finally:
        unmask_heads(model)


class _ScaleHeads:
    """Forward pre-hook: x [..., H * hd] -> x with head h's slice scaled by xi[h] (or xi[b, h])."""

    def __init__(self, xi: torch.Tensor, num_heads: int, head_dim: int):
        self.xi, self.num_heads, self.head_dim = xi, num_heads, head_dim

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        x = args[0]  # [batch, ..., H * hd]
        xi = self.xi.to(dtype=x.dtype, device=x.device)
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

