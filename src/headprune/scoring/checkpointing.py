"""Activation checkpointing per transformer block while scoring: I_h of billion-parameter models in RAM.

The mask-gradient pass (:func:`.gradients.mask_gradients`) keeps every block's activations alive until
the backward pass: for a 16-layer 1B decoder over 512 tokens that is gigabytes beside the weights.
``with checkpointed_blocks(model):`` makes each block keep only its inputs and recompute its
activations in the backward pass (``torch.utils.checkpoint``, non-reentrant, so gradients still reach
the head masks, which are not inputs of the blocks). Peak memory becomes the weights + one input per
block + one block's activations + the output head. Parameters stay frozen (no parameter gradients).

The recomputation runs the same operations on the same inputs, so the scores are those of the plain
pass (eval mode: no dropout). Costs about one more forward pass. Outside ``torch.enable_grad()`` (eval
under ``no_grad``) blocks run as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..core.model.sites import find_sites


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks holding the model's attention sites (``model.layers.3``, ``encoder.layer.0``...), in order."""
    paths: list[str] = []
    for site in find_sites(model):
        parts = site.path.split(".")
        i = next((k for k, p in enumerate(parts) if p.isdigit()), None)
        if i is None:
            continue
        path = ".".join(parts[: i + 1])
        if path not in paths:
            paths.append(path)
    return [model.get_submodule(p) for p in paths]


@contextmanager
def checkpointed_blocks(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block, every transformer block recomputes its activations in the backward pass."""
    patched: list[tuple[nn.Module, Callable | None]] = []
    for block in transformer_blocks(model):
        previous = block.__dict__.get("forward")  # an instance-level forward someone else patched in
        block.forward = _checkpointed(block.forward)
        patched.append((block, previous))
    try:
        yield model
    finally:
        for block, previous in reversed(patched):
            if previous is None:
                del block.forward  # back to the class's forward
            else:
                block.forward = previous


def _checkpointed(forward: Callable) -> Callable:
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
