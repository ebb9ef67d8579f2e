"""The public surgery: verify, then cut -- for heads and FFN neurons alike.

Each function checks its arguments against the model (nothing changes on a bad call), refuses a model
with a mask applied, proves on a shrunk copy of the model's class that surgery of this kind of unit is
exact for it (:mod:`.verify`; a family it cannot prune exactly is refused before it is touched), then
cuts (:mod:`.surgery` for heads, :mod:`.neurons` for neurons; atomic). ``verify=False`` (CLI:
``--no-verify``) skips the trial only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import nn

from .cut.neurons import check_neuron_drops, cut_neurons
from .cut.surgery import check_head_drops, cut_heads, heads_to_drop
from .model.kept import kept_heads, kept_neurons
from .model.records import KeptHeads
from .safety.verify import give_removed_sites_calls, verify_surgery


def prune_heads(model: nn.Module, dropped: Mapping[str, Iterable[int]], *, verify: bool = True) -> KeptHeads:
    """Remove ``dropped`` ({site name: indices among the site's current heads}) from ``model`` in place.

    Everything is validated before anything changes, and ``verify`` first proves on a shrunk copy of
    the model's class that surgery is exact for it (:mod:`.verify`; refused otherwise). The call is
    atomic: if slicing fails half way, the model is restored to what it was. Returns the model's
    :data:`KeptHeads` afterwards ({site: original indices of the kept heads}), also stored in
    ``model.config``.
    """
    drops = check_head_drops(model, dropped)
    if not drops:
        return kept_heads(model)
    if verify:
        verify_surgery(model, ("heads",))
    kept = cut_heads(model, drops)
    give_removed_sites_calls(model)  # a site left without heads runs the same in any process
    return kept


def keep_heads(model: nn.Module, kept: Mapping[str, Iterable[int]],
               original: Mapping[str, int] | None = None, *, verify: bool = True) -> KeptHeads:
    """Replay :data:`KeptHeads` ({site: original indices of kept heads}) on an unpruned model.

    ``original`` ({site: heads before pruning}, as saved beside the kept heads) refuses a model of
    another shape before anything changes.
    """
    return prune_heads(model, heads_to_drop(model, kept, original), verify=verify)


def prune_neurons(model: nn.Module, dropped: Mapping[str, Iterable[int]], *,
                  verify: bool = True) -> dict[str, list[int]]:
    """Remove ``dropped`` ({ffn: indices among the neurons it has now}) from ``model`` in place; returns the
    kept neurons (original indices). Validated before anything changes, verified like heads (a family whose
    FFN mixes its intermediate features is refused untouched), atomic."""
    drops = check_neuron_drops(model, dropped)
    if drops and verify:
        verify_surgery(model, ("neurons",))
    return cut_neurons(model, drops)


def replay_kept_heads(model: nn.Module, kept: Mapping[str, Iterable[int]], original: Mapping[str, int] | None = None,
                      *, verify: bool = True):
    """Replay ``kept`` ({site: original indices of the heads kept}, e.g. :func:`headprune.kept_heads` of a
    pruned model) on an unpruned ``model``; returns its KeptHeads. ``original`` ({site: heads before
    pruning}) refuses a model of another shape before anything changes. (The public name of :func:`keep_heads`.)"""
    return keep_heads(model, kept, original, verify=verify)


__all__ = ["prune_heads", "keep_heads", "replay_kept_heads", "prune_neurons", "kept_heads", "kept_neurons"]
