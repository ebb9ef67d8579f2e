"""The key/value cache a model keeps while it generates, from its shapes.

Per layer and token, a decoder self-attention site caches a key and a value for every key/value head
the attention sees: ``2 * kv_heads_cached * head_dim * dtype bytes``. Under grouped-query attention
pruned unevenly (:class:`~headprune.core.model.runtime.RepeatHeads`) the attention sees some key/value
heads more than once and the cache holds each copy, so ``kv_heads_cached`` is the number of heads
seen (``kept query heads / gcd(kept query heads per key/value head)``), not the number computed.
Cross-attention sites cache the same per *source* token; encoder sites cache nothing. A removed site
keeps a one-float placeholder per token for key and value (:mod:`.runtime`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from torch import nn

from .kept import original_heads
from .sites import find_sites, kv_of_heads


def cached_kv_heads(groups: Sequence[int], kept: Iterable[int]) -> int:
    """Key/value heads a site caches when it keeps query heads ``kept``; ``groups[h]`` is the key/value head of
    query head ``h``. Surgery keeps groups as large as the gcd of the kept heads per key/value head."""
    counts: dict[int, int] = {}
    for h in kept:
        counts[groups[h]] = counts.get(groups[h], 0) + 1
    if not counts:
        return 0
    return sum(counts.values()) // math.gcd(*counts.values())


def kv_head_bytes(model: nn.Module, dtype_bytes: int | None = None) -> dict[str, int]:
    """{site: bytes per token that one cached key/value head of the site costs} (0 for encoder sites)."""
    size = dtype_bytes or _dtype_bytes(model)
    return {s.name: 0 if s.kind == "encoder" else 2 * s.head_dim * size for s in find_sites(model)}


def kv_cache_bytes(model: nn.Module, dtype_bytes: int | None = None) -> dict:
    """The cache per token of ``model`` as it is now: ``per_token`` (decoder self-attention, all layers),
    ``per_source_token`` (cross-attention), ``sites`` {site: bytes per token}, ``kv_heads`` {site: heads
    cached}. ``dtype_bytes`` defaults to the model's parameter dtype."""
    size = dtype_bytes or _dtype_bytes(model)
    sites, heads = {}, {}
    found = find_sites(model)
    for s in found:
        if s.kind == "encoder":
            continue
        cached = cached_kv_heads(kv_of_heads(s), range(s.num_heads))
        heads[s.name] = cached
        sites[s.name] = 2 * cached * s.head_dim * size
    for name in original_heads(model):  # removed sites keep a one-float placeholder for key and value
        if not name.startswith("encoder.") and name not in {s.name for s in found}:
            sites[name], heads[name] = 2 * size, 0
    per_token = sum(b for name, b in sites.items() if not name.endswith(".cross"))
    per_source = sum(b for name, b in sites.items() if name.endswith(".cross"))
    return {"per_token": per_token, "per_source_token": per_source, "sites": sites, "kv_heads": heads,
            "dtype_bytes": size}


def _dtype_bytes(model: nn.Module) -> int:
    p = next(model.parameters(), None)
    return 4 if p is None else p.element_size()
