"""Plain rows describing a model's sites, for tables, JSON and reports."""

from __future__ import annotations

from torch import nn

from .sites import find_sites


def site_params(site) -> int:
    """Parameters of the site's q/k/v/o projections (a fused projection counted once)."""
    modules = {id(m): m for m in (site.q.module, site.k.module, site.v.module, site.o)}
    return sum(p.numel() for m in modules.values() for p in m.parameters())


def sites_table(model: nn.Module) -> list[dict]:
    return [
        {"name": s.name, "kind": s.kind, "layer": s.layer, "heads": s.num_heads, "kv_heads": s.num_kv_heads,
         "head_dim": s.head_dim, "params": site_params(s), "module": s.path}
        for s in find_sites(model)
    ]
