"""Activation checkpointing for scoring: keep each block's input, recompute its inside in the backward.

Scoring needs one backward to the mask variables; by default autograd keeps every layer's activations
until then (for a 1B-parameter decoder at 512 tokens, about as many bytes as the weights). With
:func:`checkpointed` each transformer block (the element of a ``ModuleList`` that holds a site) keeps
only its input and is run again during the backward; the mask hooks run again with it, so
``dL/dxi`` is unchanged, at the cost of about one more forward. Non-reentrant checkpointing (no
parameter gradients are needed, and keyword arguments pass through).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torch.utils.checkpoint import checkpoint

from ..core.sites import ancestors, find_sites


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of ``model``: for each site, its outermost ancestor that is an element of a
    ``ModuleList`` (a layer of ``model.layers``, ``encoder.layer``, T5's ``encoder.block``...), in model order."""
    found: dict[int, nn.Module] = {}
    for site in find_sites(model):
        chain = ancestors(model, site.path)
        for parent, child in zip(chain[:-1], chain[1:], strict=True):
            if isinstance(parent, nn.ModuleList):
                found.setdefault(id(child), child)
                break
    return list(found.values())


@contextmanager
def checkpointed(model: nn.Module) -> Iterator[list[nn.Module]]:
    """Inside the block, every transformer block of ``model`` runs under activation checkpointing."""
    wrapped = [b for b in blocks(model) if "forward" not in b.__dict__]
    for block in wrapped:
        block.forward = functools.partial(_checkpoint, block.forward)
    try:
        yield wrapped
    finally:
        for block in wrapped:
            del block.forward


def _checkpoint(forward, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
