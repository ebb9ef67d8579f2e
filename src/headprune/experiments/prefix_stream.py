"""A prefix cache that streams: only the input of the layer being swept is held, never every block's outputs.

:mod:`.prefix_cache` records the output of every block once and keeps all of them for the whole sweep:
``L x`` the evaluation set's hidden states, gigabytes for a billion-parameter model over a real data set.
A one-head sweep visits its sites layer by layer, and a masked head at layer ``l`` only needs the
unmasked output of block ``l - 1`` (and the last block of every earlier stack). :class:`PrefixStream`
keeps exactly those. When the sweep moves up to a new layer it runs the evaluator once, unmasked, with
the blocks below the old layer replayed, recording the new layer's input; then drops the old one. So
the sweep holds one layer's input (two while moving) and costs one extra partial pass per layer, i.e.
``1 / H`` more than the full cache (plus one full pass when the sweep does not start at the first
layer). A site below the held layer (an unusual order) starts again from a full pass. The replayed
inputs are the values the full cache holds (the same blocks on the same inputs), so the sweep's scores
are the full cache's.

``with streaming(model, sites) as cache: base = evaluator.evaluate(model)`` then, per unit,
``with replay(cache, site, evaluator): evaluator.evaluate(model, mask)``; :func:`replay` also takes a
full :class:`~.prefix_cache.PrefixCache`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from torch import nn

from ..core.model.sites import Site
from .prefix_cache import PrefixCache, block_index, find_stacks, recording, replaying

Key = tuple[str, int]  # (stack path, block index)


@dataclass
class PrefixStream(PrefixCache):
    """A :class:`PrefixCache` whose ``outputs`` hold only what the blocks below ``held`` need."""

    model: nn.Module | None = None
    held: Site | None = None  # the site whose prefix ``outputs`` holds; None: nothing recorded yet
    passes: int = 0  # evaluations run to move the held layer (the baseline not counted)

    def needed(self, site: Site) -> list[Key]:
        """The recorded outputs that replaying the blocks below ``site`` reads."""
        stack_path, layer = block_index(site)
        target = self.stacks[stack_path]
        keys = []
        for stack in self.stacks.values():
            if not self.replayable(stack):
                continue
            upto = len(stack.blocks) if stack.order < target.order else layer if stack is target else 0
            if upto > 0:
                keys.append((stack.path, upto - 1))
        return keys

    def _position(self, site: Site) -> tuple[int, int]:
        stack_path, layer = block_index(site)
        return self.stacks[stack_path].order, layer

    def move_to(self, site: Site, evaluator) -> None:
        """Hold ``site``'s prefix, dropping the one held before: one unmasked evaluation unless the
        prefix is already held or ``site`` needs none."""
        keys = self.needed(site)
        if keys == (self.needed(self.held) if self.held is not None else []):
            self.held = site
            return
        ahead = self.held is not None and self._position(site) >= self._position(self.held)
        with self._recording(keys) as outputs, (replaying(self, self.held) if ahead else _nothing()):
            evaluator.evaluate(self.model)
        self.outputs, self.held = outputs, site  # the old layer's outputs are released here
        self.passes += 1

    @contextmanager
    def replaying(self, site: Site, evaluator) -> Iterator[None]:
        """Inside the block, blocks below ``site`` return the recorded outputs (moving there first)."""
        self.move_to(site, evaluator)
        with replaying(self, site):
            yield

    @contextmanager
    def _recording(self, keys: list[Key]) -> Iterator[dict[Key, list]]:
        outputs: dict[Key, list] = {key: [] for key in keys}
        handles = [self.stacks[path].blocks[b].register_forward_hook(_append(outputs[(path, b)])) for path, b in keys]
        try:
            yield outputs
        finally:
            for handle in handles:
                handle.remove()


@contextmanager
def streaming(model: nn.Module, sites: list[Site], *, decoder_replay: bool = True,
              first: Site | None = None) -> Iterator[PrefixStream]:
    """Like :func:`.prefix_cache.recording`, but the pass run inside records only the prefix of
    ``first`` (the site swept first; none when not given): the rest is recorded layer by layer as
    :func:`replay` moves up."""
    stream = PrefixStream(find_stacks(model, sites), decoder_replay=decoder_replay, model=model)
    with stream._recording(stream.needed(first) if first is not None else []) as outputs:
        yield stream
    stream.outputs, stream.held = outputs, first


def recorder(prefix_cache: bool | str) -> Callable[..., AbstractContextManager[PrefixCache]]:
    """:func:`streaming` for ``prefix_cache="stream"``, else :func:`.prefix_cache.recording`."""
    return streaming if prefix_cache == "stream" else recording


def replay(cache: PrefixCache, site: Site, evaluator) -> AbstractContextManager[None]:
    """Blocks below ``site`` replayed from ``cache`` (a stream first moves to ``site``, with ``evaluator``)."""
    return cache.replaying(site, evaluator) if isinstance(cache, PrefixStream) else replaying(cache, site)


def _append(store: list) -> Callable:
    def hook(module, args, output):
        store.append(output)

    return hook


@contextmanager
def _nothing() -> Iterator[None]:
    yield
