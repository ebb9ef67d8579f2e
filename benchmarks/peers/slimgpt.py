"""SlimGPT: layer-wise structured pruning by the Optimal Brain Surgeon (Ling, Wang, Yan & Liu, "SlimGPT:
Layer-wise Structured Pruning for Large Language Models", NeurIPS 2024, arXiv 2412.18110). No official
repository; re-implemented from the paper, with the schedules read (not copied) from a public adaptation of
its code, github.com/aden9460/EdgeVAR ``slimgpt_pub/slim_utils/slimgpt.py`` and ``slimgpt_pub/prune.py``.

What it does, and here:

1. Layers in order, each on the inputs of the model already pruned below it (SparseGPT's sequential
   framework): per layer ``H = X^T X`` of the inputs of o_proj (the heads' outputs) and of down_proj (the
   neurons), damped by 1% of its mean diagonal (``percdamp 0.01``; :mod:`peers.obs`).
2. **Batched Greedy Pruning, heads**: the head with the lowest group OBS error goes, the remaining columns
   get the OBS update and ``Hinv`` its downdate, and the errors are recomputed: one head at a time,
   ``round(r_l x H)`` heads (the code's ``target_columns``). The code estimates a head's error from the
   diagonal of the Cholesky factor of its ``Hinv`` block; here it is the exact
   ``1/2 tr(W_Q [Hinv_QQ]^-1 W_Q^T)``, which that estimate approximates.
3. **Dynamic Group Size, FFN**: each round the columns of lowest OBS error ``||W_j||^2 / Hinv_jj`` go as one
   batch, with the OBS update (the code removes a batch column by column in that order, which ends at the
   same weights), and the batch shrinks: ``min(left, max(b, 64), 1024)`` columns with
   ``b = (target - 512) // 2`` and then ``b = (b - 512) // 2`` each round, as the code (:func:`ffn_batches`).
4. **Incremental Pruning Ratio**: per-layer ratios rising logarithmically with depth,
   ``r_l = r_0 + (r_last - r_0) log(1 + l) / log(L)`` (the code's ``log_increase``; its defaults
   ``0.06 -> 0.30`` on 32 layers put the first layer at a quarter of the mean: ``first = 0.25`` here), with
   ``r_last`` set so the parameter-weighted mean is the model's ratio ``r``; ratios are capped at 0.9.
   Neurons per layer: until the layer has lost ``r_l`` of its parameters (to the next whole neuron).
   ``first = 1`` is the uniform ratio, what the public code runs without ``--non_uniform`` (its default).

Knobs (:func:`slimgpt_plan`; ``benchmarks/llm_peers.py --choose-peer-knobs`` chooses among them on held-out
calibration blocks): ``damping`` (the code's ``--percdamp``, default 0.01) and ``first``, the first layer's
ratio as a share of the mean (0.25: the logarithmic schedule of the code's defaults; 1: uniform).

Budget matching (stated): ``r = target / parameters of all layers' units``, so the total meets the
non-embedding target like every other method (within about one unit per layer). GQA (absent from the
LLaMA-1/2 of the paper): query heads are removed one by one; a key/value head goes with its group's last
query head.
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
FIRST = 0.25  # the first layer's ratio, as a share of the model's ratio
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


def ffn_batches(target: int):
    """Dynamic group size: a callable giving the next FFN batch from the columns ``left`` to remove, the code's
    ``min(left, max(b, 64), 1024)`` with ``b = (target - 512) // 2`` shrinking by ``b = (b - 512) // 2``."""
    state = {"b": (target - 512) // 2}

    def batch(left: int) -> int:
        out = min(left, max(state["b"], 64), 1024)
        state["b"] = (state["b"] - 512) // 2
        return out
    return batch


def _heads(w, h, groups, k):
    drop, w_new, _ = greedy_remove(w, h, groups, k)
    return drop, w_new


def _neurons(w, h, groups, k):
    drop, w_new, _ = greedy_remove(w, h, groups, k, batch=ffn_batches(k))
    return drop, w_new


def slimgpt_plan(model: nn.Module, batches, budget: float, *, damping: float = DAMPING, first: float = FIRST) -> Plan:
    """SlimGPT's plan removing ``budget`` of the non-embedding parameters (OBS-updated o/down weights folded)."""
    if not (isinstance(first, (int, float)) and 0 < first <= 1):
        raise ConfigError(f"first={first!r}; allowed: the first layer's share of the mean ratio, in (0, 1]")
    if not (isinstance(damping, (int, float)) and math.isfinite(damping) and damping > 0):
        raise ConfigError(f"damping={damping!r}; allowed: a finite number > 0")
    start = time.perf_counter()
    batches = list(batches)
    ledger = Ledger(model, budget)
    pairs = layer_pairs(ledger)
    pools = [ledger.layer_pool(layer) for layer, _, _ in pairs]
    ratio = ledger.target / sum(pools)
    shares = incremental_ratios(ratio, len(pairs), first)
    scale = ratio * sum(pools) / sum(s * p for s, p in zip(shares, pools, strict=True))  # weighted mean = ratio
    shares = [min(CAP, s * scale) for s in shares]
    weights = layerwise(model, batches, ledger, shares, _heads, _neurons, damping,
                        heads_of=lambda share, n: round(share * n))
    if not ledger.met:  # the cap or int(r x H) left a shortfall: the last layers' lowest-index neurons do not
        raise ConfigError(f"budget={budget}: SlimGPT's incremental ratios removed {ledger.removed} of the "
                          f"{ledger.target} parameters asked for")
    plan = ledger.plan("slimgpt", info={"ratio": ratio, "ratios_per_layer": shares, "damping": damping,
                                        "first_layer_share": first, "heads": "round(r x H), one at a time, OBS update after each",
                                        "ffn": "batches min(left, max(b, 64), 1024), b shrinking, OBS update after each",
                                        "sequential": True, "seconds": time.perf_counter() - start},
                       weights={k: v.to(torch.float32) for k, v in weights.items()})
    return plan
