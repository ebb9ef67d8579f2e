"""A prefix cache that streams: only the input of the layer being swept is held, never every block's outputs.

:mod:`.prefix_cache` records the output of every block once and keeps all of them for the whole sweep:
``L x`` the evaluation set's hidden states, gigabytes for a billion-parameter model over a real data set.
A one-head sweep visits its sites layer by layer, and a masked head at layer ``l`` only needs the
unmasked output of block ``l - 1`` (and the last block of every earlier stack). :class:`PrefixStream`
keeps exactly those. When the sweep moves up to a new layer it runs the evaluator once, unmasked, with
the blocks below the old layer replayed, recording the new layer's input; then drops the old one. So
the sweep holds one layer's input (two while moving) and costs one extra partial pass per layer, i.e.
``1 / H`` more than the full cache. A site below the held layer (an unusual order) starts again from
a full pass. The replayed inputs are the same values the full cache holds (the same blocks on the
same inputs), so the sweep's scores are those of the full cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

from ..core.sites import Site, find_sites
from .prefix_cache import PrefixCache, block_index, find_stacks, replaying

Key = tuple[str, int]  # (stack path, block index)


class PrefixStream:
    """``base``: the unmasked evaluation; ``with stream.replaying(site): evaluator.evaluate(model, mask)``.

    ``first``: the site swept first (its layer's input is recorded during the baseline pass).
    ``decoder_replay=False``: decoder stacks are never replayed (evaluators that generate)."""

    def __init__(self, model: nn.Module, evaluator, first: Site | None = None, *, decoder_replay: bool = True,
                 progress: bool = False):
        self.model, self.evaluator = model, evaluator
        self.cache = PrefixCache(find_stacks(model, find_sites(model)), decoder_replay=decoder_replay)
        self.held: Site | None = None  # the site whose prefix ``cache.outputs`` holds
        self.passes = 0  # evaluations run to move the held layer (the baseline not counted)
        with self._recording(self.needed(first) if first is not None else []) as outputs:
            self.base = evaluator.evaluate(model, progress=progress)
        self.cache.outputs, self.held = outputs, first

    def needed(self, site: Site) -> list[Key]:
        """The recorded outputs that replaying the blocks below ``site`` reads."""
        stack_path, layer = block_index(site)
        target = self.cache.stacks[stack_path]
        keys = []
        for stack in self.cache.stacks.values():
            if not self.cache.replayable(stack):
                continue
            upto = len(stack.blocks) if stack.order < target.order else layer if stack is target else 0
            if upto > 0:
                keys.append((stack.path, upto - 1))
        return keys

    def _position(self, site: Site) -> tuple[int, int]:
        stack_path, layer = block_index(site)
        return self.cache.stacks[stack_path].order, layer

    def move_to(self, site: Site) -> None:
        """Hold ``site``'s prefix (one evaluation unless it is already held), dropping the one held before."""
        keys = self.needed(site)
        if self.held is not None and keys == self.needed(self.held):
            return
        ahead = self.held is not None and self._position(site) >= self._position(self.held)
        replay = replaying(self.cache, self.held) if ahead else _nothing()
        with self._recording(keys) as outputs, replay:
            self.evaluator.evaluate(self.model)
        self.cache.outputs, self.held = outputs, site  # the old layer's outputs are released here
        self.passes += 1

    @contextmanager
    def replaying(self, site: Site) -> Iterator[None]:
        """Inside the block, blocks below ``site`` return the recorded outputs (moving there first)."""
        self.move_to(site)
        with replaying(self.cache, site):
            yield

    @contextmanager
    def _recording(self, keys: list[Key]) -> Iterator[dict[Key, list]]:
        outputs: dict[Key, list] = {key: [] for key in keys}
        handles = [self.cache.stacks[path].blocks[b].register_forward_hook(_append(outputs[(path, b)]))
                   for path, b in keys]
        try:
            yield outputs
        finally:
            for handle in handles:
                handle.remove()


def _append(store: list) -> Callable:
    def hook(module, args, output):
        store.append(output)

    return hook


@contextmanager
def _nothing() -> Iterator[None]:
    yield
