"""Skip the layers below a masked site: record block outputs once, replay them for every head.

Masking a head at layer ``l`` cannot change blocks below ``l`` (nor a whole encoder when the site is in
the decoder). A sweep therefore runs the unmasked model once while recording the output of every
transformer block, and evaluates each masked head with the blocks below its layer replaced by a
stub that returns the recorded output. Only blocks ``l..L-1`` (plus embeddings and the output head)
are computed, so a one-head sweep costs about ``(L + 1) / 2L`` of the naive ``L x H`` passes.

Works by call order, so it needs an evaluator that calls the model the same way every time (all
ours do). Generation calls decoder blocks once per step with changing inputs: with
``decoder_replay=False`` only encoder stacks are recorded and replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import nn

from ..core.model.sites import Site


@dataclass
class Stack:
    """A ModuleList of transformer blocks (e.g. ``model.encoder.layer``), in execution order."""

    path: str
    blocks: nn.ModuleList
    order: int  # 0 for the first stack the forward runs (the encoder of an encoder-decoder)
    decoder: bool


@dataclass
class PrefixCache:
    stacks: dict[str, Stack]
    outputs: dict[tuple[str, int], list] = field(default_factory=dict)  # (stack, block) -> outputs per call
    decoder_replay: bool = True

    def replayable(self, stack: Stack) -> bool:
        return self.decoder_replay or not stack.decoder


def find_stacks(model: nn.Module, sites: list[Site]) -> dict[str, Stack]:
    """The block lists holding the sites: the path prefix up to the first numeric component."""
    found: dict[str, Stack] = {}
    for site in sites:
        parts = site.path.split(".")
        i = next(k for k, p in enumerate(parts) if p.isdigit())
        path = ".".join(parts[:i])
        if path not in found:
            blocks = model.get_submodule(path)
            decoder = "decoder" in parts[:i] or site.kind != "encoder"
            found[path] = Stack(path, blocks, order=len(found), decoder=decoder)
    return found


def block_index(site: Site) -> tuple[str, int]:
    parts = site.path.split(".")
    i = next(k for k, p in enumerate(parts) if p.isdigit())
    return ".".join(parts[:i]), int(parts[i])


@contextmanager
def recording(model: nn.Module, sites: list[Site], *, decoder_replay: bool = True):
    """Yields a :class:`PrefixCache` that fills while the model runs inside the block."""
    cache = PrefixCache(find_stacks(model, sites), decoder_replay=decoder_replay)
    handles = []
    for stack in cache.stacks.values():
        if not cache.replayable(stack):
            continue
        for b, block in enumerate(stack.blocks):
            store = cache.outputs.setdefault((stack.path, b), [])
            handles.append(block.register_forward_hook(_append(store)))
    try:
        yield cache
    finally:
        for h in handles:
            h.remove()


def _append(store: list) -> Callable:
    def hook(module, args, output):
        store.append(output)

    return hook


@contextmanager
def replaying(cache: PrefixCache, site: Site):
    """Inside the block, blocks below ``site`` (and whole earlier stacks) return recorded outputs."""
    stack_path, layer = block_index(site)
    target = cache.stacks[stack_path]
    patched = []
    for stack in cache.stacks.values():
        if not cache.replayable(stack):
            continue
        if stack.order < target.order:
            upto = len(stack.blocks)
        elif stack is target:
            upto = layer
        else:
            continue
        if upto == 0:
            continue
        # every skipped block returns the last skipped block's recorded output for this call: the
        # blocks between ignore their inputs, so what they return only has to be the right type
        recorded = iter(cache.outputs[(stack.path, upto - 1)])
        state = {"current": None}
        for b in range(upto):
            block = stack.blocks[b]
            block.forward = _replay(state, recorded, advance=b == 0)
            patched.append(block)
    try:
        yield
    finally:
        for block in patched:
            del block.forward  # back to the class's forward


def _replay(state: dict, recorded, advance: bool) -> Callable:
    def forward(*args, **kwargs):
        if advance:
            state["current"] = next(recorded)
        return state["current"]

    return forward
