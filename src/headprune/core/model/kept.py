"""What a model keeps: the original indices of its heads and FFN neurons, read from its config's records
(:mod:`.records`), or all of them for a model never pruned."""

from __future__ import annotations

from torch import nn

from .ffn import find_ffns
from .records import KEPT_KEY, KEPT_NEURONS_KEY, ORIGINAL_KEY, ORIGINAL_NEURONS_KEY, KeptHeads, config_record
from .sites import find_sites


def original_heads(model: nn.Module) -> dict[str, int]:
    """Number of heads each site had before any pruning (removed sites included)."""
    recorded = config_record(model.config, ORIGINAL_KEY)
    if recorded:
        return recorded
    return {s.name: s.num_heads for s in find_sites(model)}


def kept_heads(model: nn.Module) -> KeptHeads:
    """For every site, the original indices of the heads it has now, in the order it holds them."""
    kept = config_record(model.config, KEPT_KEY) or {}
    return {name: list(kept.get(name, range(n))) for name, n in original_heads(model).items()}


def original_neurons(model: nn.Module) -> dict[str, int]:
    """{ffn: width before any pruning}."""
    recorded = config_record(model.config, ORIGINAL_NEURONS_KEY)
    current = {f.name: f.width for f in find_ffns(model)}
    return {**current, **(recorded or {})}


def kept_neurons(model: nn.Module) -> dict[str, list[int]]:
    """{ffn: original indices of the neurons it keeps} (all of them when not pruned)."""
    kept = config_record(model.config, KEPT_NEURONS_KEY) or {}
    return {name: list(kept.get(name, range(n))) for name, n in original_neurons(model).items()}
