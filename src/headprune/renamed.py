"""Public names that say what they hold, and the names they replace (deprecated for one release).

``keep_heads(model, kept)`` read as "keep N heads" but replays a :data:`~headprune.core.surgery.KeptHeads`
plan ({site: original indices kept}) on an unpruned model: it is now :func:`replay_kept_heads`.
:func:`headprune.kept_heads` (read the plan a pruned model carries) keeps its name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import nn

from . import core
from .deprecation import deprecated


def replay_kept_heads(model: nn.Module, kept: Mapping[str, Iterable[int]], original: Mapping[str, int] | None = None,
                      *, verify: bool = True):
    """Replay ``kept`` ({site: original indices of the heads kept}, e.g. :func:`headprune.kept_heads` of a
    pruned model) on an unpruned ``model``; returns its KeptHeads. ``original`` ({site: heads before
    pruning}) refuses a model of another shape before anything changes."""
    return core.keep_heads(model, kept, original, verify=verify)


def keep_heads(model: nn.Module, kept: Mapping[str, Iterable[int]], original: Mapping[str, int] | None = None,
               *, verify: bool = True):
    """Deprecated name of :func:`replay_kept_heads`."""
    deprecated("headprune.keep_heads", "headprune.replay_kept_heads")
    return core.keep_heads(model, kept, original, verify=verify)
