"""``compensate="obs-seq"``'s choice of *which* units go inside each site and FFN of one block, on the moments of
the block's inputs in the pruned model (:mod:`headprune.compression.blockwise`, ``sequential``).

The selection decides how many heads each key/value group and how many neurons each FFN loses (the one budget over
the whole model, by the scorer's scores); here those counts are kept and the units re-chosen by the output error
their removal leaves after the best linear stand-in (:func:`headprune.core.cut.obs.greedy_removal`). Pools: the query
heads reading one key/value head (so a GQA selection's kept key/value heads stay kept), all neurons of an FFN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ..core.cut.obs import greedy_removal
from ..core.model.ffn import find_ffns
from ..core.model.sites import find_sites, is_conv1d, kv_of_heads


def reselect(model: nn.Module, stats, heads: Mapping[str, Sequence[int]], neurons: Mapping[str, Sequence[int]],
             damping: float) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """({site: heads}, {ffn: neurons}) to drop, as many per pool as ``heads`` / ``neurons`` name, chosen by the OBS
    error on ``stats`` (``mean`` and ``second`` of each projection's inputs, keyed by site / FFN name)."""
    sites = {s.name: s for s in find_sites(model) if list(heads.get(s.name, ()))}
    ffns = {f.name: f for f in find_ffns(model, skip_moe=True) if list(neurons.get(f.name, ()))}
    new_heads = {name: list(v) for name, v in heads.items()}
    new_neurons = {name: list(v) for name, v in neurons.items()}
    for name, site in sites.items():
        kv = kv_of_heads(site)
        drop = {int(h) for h in heads[name]}
        pools = [([h for h in range(site.num_heads) if kv[h] == g], sum(kv[h] == g for h in drop))
                 for g in sorted(set(kv))]
        new_heads[name] = greedy_removal(_weight(site.o), stats.mean[name], stats.second[name],
                                         [p for p in pools if p[1]], site.head_dim, damping)
    for name, ffn in ffns.items():
        w = _weight(ffn.down)
        new_neurons[name] = greedy_removal(w, stats.mean[name], stats.second[name],
                                           [(range(w.shape[1]), len(list(neurons[name])))], 1, damping)
    return new_heads, new_neurons


def _weight(module: nn.Module) -> torch.Tensor:
    """``[d_out, C]`` of a projection (GPT-2's Conv1D stores the transpose), on the CPU."""
    w = module.weight.detach()
    return (w.T if is_conv1d(module) else w).cpu()
