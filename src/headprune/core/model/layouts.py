"""How a fused q/k/v projection orders its rows by head: one description (:class:`FusedLayout`) for the
layouts transformers' families use, read by site finding (:mod:`.sites`) and by surgery (:mod:`.surgery`);
which family uses which is in the family table (:mod:`.families`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class FusedLayout:
    """How one fused projection orders its output rows, in blocks of ``head_dim`` rows.

    ``order``: ``"blocks"`` -- [q heads | k heads | v heads] (GPT-2's ``c_attn``, Phi-3's ``qkv_proj``,
    ModernBERT's ``Wqkv``, multi-query Falcon and GPT-BigCode, whose k and v are one head each);
    ``"heads"`` -- [q_h | k_h | v_h] for each head (GPT-NeoX, Persimmon, Falcon and GPT-BigCode without
    multi-query); ``"groups"`` -- [its q heads | k | v] for each key/value head (Falcon's new decoder
    architecture). ``parts``: what the module holds (GPT-2's cross-attention ``c_attn``: k and v only).
    """

    order: str
    parts: tuple[str, ...] = ("q", "k", "v")

    def blocks(self, query: list[int] | int, kv: list[int] | int, group: int | None = None) -> list[tuple[str, int]]:
        """The (part, head) of each block of rows, in order, for query heads ``query`` and the key/value
        heads ``kv`` as the attention reads them (one per group of ``group`` query heads; an int ``n`` is
        heads ``0..n-1``). Under ``"groups"`` the i-th key/value head is followed by nothing but its group."""
        query = list(range(query)) if isinstance(query, int) else list(query)
        kv = list(range(kv)) if isinstance(kv, int) else list(kv)
        parts = {p: [(p, h) for h in (query if p == "q" else kv)] for p in self.parts}
        if self.order == "blocks":
            return [b for p in self.parts for b in parts[p]]
        if self.order == "heads":
            return [b for h in range(len(query)) for p in self.parts for b in [parts[p][h]]]
        size = group or len(query) // max(len(kv), 1)
        return [b for j in range(len(kv)) for b in
                [*parts["q"][j * size:(j + 1) * size], parts["k"][j], parts["v"][j]]]


def fused_order(module: nn.Module, name: str, orders: Mapping[str, str]) -> str:
    """The row order of a fused projection: the module's own flags first (Falcon's new decoder
    architecture groups per key/value head; ``multi_query`` packs [q | k | v] with one k and v head,
    otherwise per head), then its family's order for the projection's name (``orders``: fused name ->
    order, :attr:`.families.KnownNames.fused_order`), else ``"blocks"``."""
    if getattr(module, "new_decoder_architecture", False) is True:
        return "groups"
    if isinstance(getattr(module, "multi_query", None), bool):
        return "blocks" if module.multi_query else "heads"
    return orders.get(name, "blocks")
