"""FLAP: fluctuation-based adaptive structured pruning (An et al., "Fluctuation-based Adaptive Structured
Pruning for Large Language Models", AAAI 2024; code github.com/CASIA-IVA-Lab/FLAP, ``lib/prune.py``
``prune_flap`` and ``lib/layerwrapper.py`` ``BiasGPT``, read at commit of the public repository, not copied).

Its defaults (``--metrics WIFV --structure AL-AM``), as the public code computes them:

1. One forward of the unpruned model over the calibration tokens records, for every output projection
   (o_proj: input = heads' outputs) and down projection (input = the FFN's neurons), each input channel's
   mean and its fluctuation, the variance over tokens ``Var(X[:, j])``.
2. WIFV per channel: ``Var(X[:, j]) * ||W[:, j]||^2``. For o_proj the code squares it
   (``metrics[...] ** 2``) before standardising; down_proj's is used as is.
3. Standardisation ``(s - mean) / std`` over the channels of each projection (``standarlization`` in the
   code: mean and unbiased std along the channel axis of the [layers, channels] stack, i.e. per layer and per
   module kind); a head's score is the mean of its ``head_dim`` standardised channels.
4. One global threshold over heads and neurons together (adaptive widths per layer, AL-AM): the code sorts
   all scores and cuts where the cumulative *parameter weight* (a head weighs ``512/3`` neurons on LLaMA-7B,
   i.e. its parameters over a neuron's) reaches the pruning ratio. Here units are taken from the lowest score
   up until the non-embedding parameters removed reach the budget (:class:`~headprune.peers.ledger.Ledger`:
   exact prices, the added biases counted) -- the same cut, priced exactly.
5. Bias compensation: ``b = W[:, removed] @ mean(X[:, removed])`` added to the projection, so the removed
   channels are replaced by their calibration means.

Differences, stated: the public code's running fluctuation skips the first sample's own variance and scales
by samples, not tokens (a per-channel constant after standardisation, apart from that first sample); here it
is the plain population variance over all calibration tokens. Its means are stored in float16; here float64
until the bias is cast to the weights' dtype. LLaMA-1/2 have no GQA: here query heads are scored and removed
one by one, and a key/value head goes with its group's last query head.

It lives in the library so that ``headprune demo`` can put it beside headprune's own compression on the same
text; ``benchmarks/peers/flap.py`` builds the peer harness's plan from the same :class:`FlapCut`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..core.cut.biases import shift_biases
from ..core.prune import prune_heads, prune_neurons
from ..core.safety.verify import verify_surgery
from .ledger import Ledger
from .stats import ChannelStats, input_stats


@dataclass
class FlapCut:
    """What FLAP removes and adds, as plain data any plan object is built from (the harness builds headprune's
    :class:`~headprune.compression.replay.Plan` from it).

    ``heads`` / ``neurons``: query heads per site and neurons per FFN dropped (indices among the unpruned
    model's units); ``biases``: {site or FFN name: [d_out] bias added to its output projection}; ``paths``:
    {site or FFN name: module path of that projection}; ``info``: the method's settings and the budget's
    bookkeeping (JSON-ready)."""

    heads: dict[str, list[int]]
    neurons: dict[str, list[int]]
    biases: dict[str, torch.Tensor] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    info: dict = field(default_factory=dict)


def standardise(s: torch.Tensor) -> torch.Tensor:
    """(s - mean) / std over the last axis (unbiased std, as ``torch.std``); a constant row maps to zeros."""
    std = s.std(dim=-1, keepdim=True, unbiased=True)
    return (s - s.mean(dim=-1, keepdim=True)) / torch.where(std > 0, std, torch.ones_like(std))


def flap_scores(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]],
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, ChannelStats]]:
    """({site: [H] head scores}, {ffn: [width] neuron scores}, {site / ffn name: ChannelStats}): standardised WIFV."""
    ledger = Ledger(model, 0.5)  # only for the model check and the site / FFN lists
    modules = {**{n: s.o for n, s in ledger.sites.items()}, **{n: f.down for n, f in ledger.ffns.items()}}
    stats = input_stats(model, batches, modules)
    heads, neurons = {}, {}
    for n, s in ledger.sites.items():
        w = s.o.weight.detach().double()  # [d, H * hd]
        wifv = stats[n].var * w.pow(2).sum(0).cpu()  # [H * hd]
        heads[n] = standardise(wifv.pow(2)).view(s.num_heads, s.head_dim).mean(1)  # [H]
    for n, f in ledger.ffns.items():
        w = f.down.weight.detach().double()  # [d, width]
        neurons[n] = standardise(stats[n].var * w.pow(2).sum(0).cpu())  # [width]
    return heads, neurons, stats


def flap(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], budget: float, *,
         bias: bool = True) -> FlapCut:
    """FLAP's cut removing ``budget`` (a share in (0, 1)) of ``model``'s non-embedding parameters, scored on
    calibration ``batches`` (model inputs; no labels read); ``bias``: compensate (FLAP's default). ``model``
    is not changed: :func:`apply_flap` applies the cut."""
    start = time.perf_counter()
    batches = list(batches)
    ledger = Ledger(model, budget, bias=bias)  # checks the budget before the forward pass
    heads, neurons, stats = flap_scores(model, batches)
    units = [(float(v), 0, "head", n, h) for n, sc in heads.items() for h, v in enumerate(sc.tolist())]
    units += [(float(v), 1, "neuron", n, j) for n, sc in neurons.items() for j, v in enumerate(sc.tolist())]
    units.sort(key=lambda u: (u[0], u[1], ledger.layer_of[u[3]], u[4]))
    ledger.take_in_order([(kind, name, i) for _, _, kind, name, i in units])
    biases = {}
    if bias:
        for n, dropped in ledger.heads.items():
            if dropped:
                s = ledger.sites[n]
                cols = torch.cat([torch.arange(h * s.head_dim, (h + 1) * s.head_dim) for h in sorted(dropped)])
                biases[n] = compensation(s.o.weight, stats[n].mean, cols)
        for n, dropped in ledger.neurons.items():
            if dropped:
                f = ledger.ffns[n]
                biases[n] = compensation(f.down.weight, stats[n].mean, torch.tensor(sorted(dropped)))
    paths = {n: ledger.paths[id(s.o)] for n, s in ledger.sites.items()}
    paths |= {n: ledger.paths[id(f.down)] for n, f in ledger.ffns.items()}
    tokens = next(iter(stats.values())).tokens
    dropped_heads, dropped_neurons = ledger.dropped()
    info = {"metric": "WIFV", "structure": "AL-AM (global threshold over heads and neurons)",
            "bias_compensation": bias, "calibration_tokens": tokens, "seconds": time.perf_counter() - start,
            **ledger.bookkeeping()}
    return FlapCut(dropped_heads, dropped_neurons, biases, {n: paths[n] for n in biases}, info)


def compensation(weight: torch.Tensor, mean: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``W[:, cols] @ mean[cols]`` [d_out]: what the removed input channels add on average."""
    return (weight.detach().double()[:, cols] @ mean[cols].to(weight.device)).to(weight.dtype)


def apply_flap(model: nn.Module, cut: FlapCut, *, verify: bool = True) -> nn.Module:
    """Apply ``cut`` to ``model`` in place, as headprune applies any plan: the biases first (so a site left without
    heads keeps its bias), then headprune's surgery (``verify``: checked exact for the model's class first)."""
    if verify:
        verify_surgery(model, ("heads", "neurons"))
    dtype = next(model.parameters()).dtype
    shift_biases(model, {name: bias.to(dtype) for name, bias in cut.biases.items()})
    heads = {k: v for k, v in cut.heads.items() if v}
    neurons = {k: v for k, v in cut.neurons.items() if v}
    if heads:
        prune_heads(model, heads, verify=False)  # verified above
    if neurons:
        prune_neurons(model, neurons, verify=False)
    return model
