"""SlimGPT: layer-wise structured pruning by the Optimal Brain Surgeon (Ling, Wang, Yan & Liu, "SlimGPT:
Layer-wise Structured Pruning for Large Language Models", NeurIPS 2024, arXiv 2412.18110; no official code,
forks only: the method is re-implemented from the paper, nothing copied).

What the paper does, and here:

1. Layers in order, each on the inputs of the model already pruned below it (SparseGPT's sequential
   framework): per layer ``H = X^T X`` of the inputs of o_proj (the heads' outputs) and of down_proj (the
   neurons), damped by 1% of its mean diagonal (:mod:`peers.obs`).
2. **Batched Greedy Pruning, heads**: the head with the lowest group OBS error
   ``tr(W_Q [Hinv_QQ]^-1 W_Q^T)`` goes, the remaining columns get the OBS update and ``Hinv`` its Schur
   downdate, and the errors are recomputed: one head at a time (the paper's grouped Cholesky computes the
   same per-head errors faster).
3. **Dynamic Group Size, FFN**: columns go in batches of the lowest OBS error, each batch followed by the
   update; the batch shrinks as the layer nears its target (here: half of the columns still to remove, at
   least one, so the last ones go one by one).
4. **Incremental Pruning Ratio**: per-layer ratios rise logarithmically with depth (error accumulates
   through the layers, so the first ones are pruned least). The paper states the shape, not one formula;
   here ``r_l = r_0 + (r_last - r_0) log(1 + l) / log(L)`` with ``r_0 = first x r`` (default ``first = 0.5``)
   and ``r_last`` set so the parameter-weighted mean is the model's ratio ``r``; ratios are capped at 0.9.
   Heads per layer ``int(r_l x H)``; neurons until the layer has lost ``r_l`` of its parameters.

Budget matching (stated): ``r = target / parameters of all layers' units``, so the total meets the
non-embedding target like every other method (within one neuron per layer). GQA (absent from the LLaMA-1/2
of the paper): query heads are removed one by one; a key/value head goes with its group's last query head.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from headprune.errors import ConfigError

from .obs import greedy_remove, layerwise
from .plan import Ledger, Plan, layer_pairs

DAMPING = 0.01
FIRST = 0.5  # the first layer's ratio, as a share of the model's ratio
CAP = 0.9  # no layer loses more than this share


def incremental_ratios(ratio: float, n_layers: int, first: float = FIRST, cap: float = CAP) -> list[float]:
    """Per-layer ratios rising with ``log(1 + l)`` from ``first x ratio``, mean ``ratio``, each at most ``cap``."""
    if not 0 < ratio < cap:
        raise ConfigError(f"ratio={ratio!r}; allowed: a share of each layer's units in (0, {cap})")
    if n_layers == 1:
        return [ratio]
    shape = [math.log(1 + layer) / math.log(n_layers) for layer in range(n_layers)]  # 0 .. 1
    lo = first * ratio
    while True:
        hi = lo + (ratio - lo) / (sum(shape) / n_layers)
        if hi <= cap or lo >= ratio:
            break
        lo = min(ratio, lo + 0.01)  # flatter until the deepest layer is within the cap
    return [min(cap, lo + (hi - lo) * s) for s in shape]


def ffn_batch(left: int) -> int:
    """Dynamic group size: half of the columns still to remove, at least one."""
    return max(1, left // 2)


def _heads(w, h, groups, k):
    drop, w_new, _ = greedy_remove(w, h, groups, k)
    return drop, w_new


def _neurons(w, h, groups, k):
    drop, w_new, _ = greedy_remove(w, h, groups, k, batch=ffn_batch)
    return drop, w_new


def slimgpt_plan(model: nn.Module, batches, budget: float, *, damping: float = DAMPING, first: float = FIRST) -> Plan:
    """SlimGPT's plan removing ``budget`` of the non-embedding parameters (OBS-updated o/down weights folded)."""
    start = time.perf_counter()
    batches = list(batches)
    ledger = Ledger(model, budget)
    pairs = layer_pairs(ledger)
    pools = [ledger.layer_pool(layer) for layer, _, _ in pairs]
    ratio = ledger.target / sum(pools)
    shares = incremental_ratios(ratio, len(pairs), first)
    scale = ratio * sum(pools) / sum(s * p for s, p in zip(shares, pools, strict=True))  # weighted mean = ratio
    shares = [min(CAP, s * scale) for s in shares]
    weights = layerwise(model, batches, ledger, shares, _heads, _neurons, damping)
    if not ledger.met:  # the cap or int(r x H) left a shortfall: the last layers' lowest-index neurons do not
        raise ConfigError(f"budget={budget}: SlimGPT's incremental ratios removed {ledger.removed} of the "
                          f"{ledger.target} parameters asked for")
    plan = ledger.plan("slimgpt", info={"ratio": ratio, "ratios_per_layer": shares, "damping": damping,
                                        "first_layer_share": first, "heads": "one at a time, OBS update after each",
                                        "ffn": "batches of half the columns left, OBS update after each",
                                        "sequential": True, "seconds": time.perf_counter() - start})
    plan.weights = {k: v.to(torch.float32) for k, v in weights.items()}
    return plan
