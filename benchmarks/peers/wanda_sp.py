"""Wanda-sp: Wanda's score (Sun et al., "A Simple and Effective Pruning Approach for Large Language Models",
ICLR 2024) made structured, as FLAP's paper uses it for a baseline (code github.com/CASIA-IVA-Lab/FLAP,
``lib/prune.py`` ``prune_wanda_sp`` and ``lib/layerwrapper.py`` ``WrappedGPT``; read, not copied).

- Score of input channel ``j`` of o_proj / down_proj: ``sum_i |W_ij| * ||X_j||_2`` (the code takes the mean
  over output rows ``i``: the same order); a head's score is the sum over its ``head_dim`` channels.
- The same ratio in every layer: the code removes ``int(ratio * num_heads)`` heads and
  ``int(ratio * width)`` neurons of each layer, the lowest scored.
- Sequential, as the code runs it: layer ``l``'s inputs are recorded with layers ``< l`` already pruned
  (both of layer ``l``'s projections are recorded in one pass before either is cut). No bias compensation.

Budget matching (stated): ``ratio = target / parameters of all layers' units``; heads by the code's formula at
that ratio, then each layer's lowest neurons until the layer has lost ``ratio`` of its parameters (to the next
whole neuron), so the total meets the non-embedding target like every other method. GQA (absent from the
LLaMA-1/2 it was written for): query heads are scored and removed one by one; a key/value head goes with its
group's last query head.
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from headprune import find_ffns, find_sites, prune_heads, prune_neurons
from headprune.peers.stats import input_stats

from .plan import Ledger, Plan, layer_pairs, uniform_layer


def wanda_channel_scores(weight: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """[C]: ``sum_i |W_ij| * ||X_j||_2`` for ``weight`` [d_out, C] and input norms ``norm`` [C]."""
    return (weight.detach().double().abs() * norm.to(weight.device).view(1, -1)).sum(0)


def wanda_sp_plan(model: nn.Module, batches, budget: float) -> Plan:
    """Wanda-sp's plan removing ``budget`` of the non-embedding parameters of ``model`` (left unchanged)."""
    start = time.perf_counter()
    batches = list(batches)
    ledger = Ledger(model, budget)
    ratio = ledger.target / sum(ledger.layer_pool(layer) for layer, _, _ in layer_pairs(ledger))
    work = copy.deepcopy(model)
    for layer, site, ffn in layer_pairs(ledger):
        s = ledger.sites[site]
        w_site = {x.name: x for x in find_sites(work)}[site]
        w_ffn = {f.name: f for f in find_ffns(work)}[ffn]
        stats = input_stats(work, batches, {site: w_site.o, ffn: w_ffn.down}, stop_after=w_ffn.down)
        head = wanda_channel_scores(w_site.o.weight, stats[site].norm).view(s.num_heads, s.head_dim).sum(1)  # [H]
        neuron = wanda_channel_scores(w_ffn.down.weight, stats[ffn].norm)  # [width]
        before_h, before_n = set(ledger.heads[site]), set(ledger.neurons[ffn])
        uniform_layer(ledger, layer, ratio, [(float(v), [h]) for h, v in enumerate(head.tolist())], site, ffn,
                      neuron, int(ratio * s.num_heads))
        drop_h = sorted(ledger.heads[site] - before_h)
        drop_n = sorted(ledger.neurons[ffn] - before_n)
        if drop_h:
            prune_heads(work, {site: drop_h}, verify=False)  # indices of an untouched site: the original ones
        if drop_n:
            prune_neurons(work, {ffn: drop_n}, verify=False)
    del work
    return ledger.plan("wanda-sp", info={"ratio_per_layer": ratio, "sequential": True,
                                         "heads_per_layer": "int(ratio x heads)", "bias_compensation": False,
                                         "seconds": time.perf_counter() - start})

