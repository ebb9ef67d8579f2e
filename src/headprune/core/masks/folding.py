"""Weight folding: make a head mask part of the weights, so a plain model computes the masked one.

:func:`fold_scales` multiplies each head's input columns of the output projection (rows of GPT-2's
Conv1D) by its scale: folding equals applying the scales as a head mask (biases are not scaled, as
masking leaves them), and pruning afterwards removes the zero-scaled heads.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ...errors import MaskError
from ..model.sites import find_sites, is_conv1d
from .masking import validate_mask


def fold_scales(model: nn.Module, scales: Mapping[str, torch.Tensor]) -> None:
    """Multiply each head's input slice of its site's output projection by ``scales`` ({site: [H]}), in place.

    The model then computes what it computed masked by ``scales`` (biases are not scaled, as masking
    leaves them). Zero-scaled heads still cost compute until :func:`headprune.prune_heads` removes them.
    """
    sites = find_sites(model)
    checked = validate_mask(sites, scales)
    by_name = {s.name: s for s in sites}
    for name, s in checked.items():
        if s.dim() != 1:
            raise MaskError(f"scales[{name!r}] has shape {tuple(s.shape)}; allowed: ({by_name[name].num_heads},)")
        site = by_name[name]
        w = site.o.weight
        with torch.no_grad():
            s = s.to(device=w.device, dtype=w.dtype)
            if is_conv1d(site.o):  # [in, out]: the head's rows
                w.copy_((w.view(site.num_heads, site.head_dim, -1) * s[:, None, None]).view_as(w))
            else:  # [out, in]: the head's columns
                w.copy_((w.view(w.shape[0], site.num_heads, site.head_dim) * s[None, :, None]).view_as(w))

