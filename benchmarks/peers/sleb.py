"""SLEB: whole transformer blocks removed one at a time by the calibration perplexity after removal (Song, Oh,
Kim, Kim & Kim, "SLEB: Streamlining LLMs through Redundancy Verification and Elimination of Transformer
Blocks", ICML 2024, arXiv 2402.09025; code github.com/jiwonsong-dev/SLEB; re-implemented from the paper,
nothing copied).

SLEB's loop: with the blocks chosen so far removed, try removing each remaining block, compute the
perplexity of the calibration text, and remove for good the block whose removal gives the lowest; repeat
until enough blocks are gone. Each candidate is evaluated on the model with the block's every head and
neuron masked (headprune's masks), which is that block removed: its attention and FFN add nothing to the
residual stream (no output biases in the Llama family; a bias would be the only difference, and
:func:`peers.plan.apply_plan` keeps a removed site's output bias exactly as the mask does).

Budget (stated): blocks are taken in SLEB's order until the non-embedding parameters removed reach the
target (:meth:`peers.plan.Ledger.take_block`), so SLEB overshoots the target by less than one block (a
block is ``1/L`` of the model: the coarsest unit of all methods). Its two norm vectors stay and count as
kept. Calibration: the harness's batches, the same as every method's (the paper: 128 WikiText-2 samples of
2048 tokens).
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from headprune import masked, masked_neurons
from headprune.core.devices import input_device, to_device
from headprune.errors import ConfigError

from .plan import Ledger, Plan


@torch.no_grad()
def calibration_nll(model: nn.Module, batches) -> tuple[float, int]:
    """(summed next-token NLL, tokens predicted) of ``model`` over ``batches``, from the model's own loss."""
    total, tokens = 0.0, 0
    device = input_device(model)
    for batch in batches:
        x = to_device({k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}, device)
        n = int((x["labels"][:, 1:] != -100).sum())
        total += float(model(**x, use_cache=False).loss) * n
        tokens += n
    return total, tokens


def block_masks(ledger: Ledger, layers: list[int]) -> tuple[dict, dict]:
    """(head mask, neuron mask): every head and neuron of ``layers`` zero, the rest one."""
    heads = {n: torch.full((s.num_heads,), 0.0 if s.layer in layers else 1.0, device=s.o.weight.device)
             for n, s in ledger.sites.items()}
    neurons = {n: torch.full((f.width,), 0.0 if f.layer in layers else 1.0, device=f.down.weight.device)
               for n, f in ledger.ffns.items()}
    return heads, neurons


def perplexity_without(model: nn.Module, batches, ledger: Ledger, layers: list[int]) -> float:
    """Calibration perplexity of ``model`` with the blocks ``layers`` removed (masked)."""
    heads, neurons = block_masks(ledger, layers)
    was_training = model.training
    model.eval()
    try:
        with masked(model, heads), masked_neurons(model, neurons):
            total, tokens = calibration_nll(model, batches)
    finally:
        model.train(was_training)
    return math.exp(total / tokens)


def sleb_plan(model: nn.Module, batches, budget: float) -> Plan:
    """SLEB's plan: whole blocks removed in its order until ``budget`` of the non-embedding parameters is gone."""
    start = time.perf_counter()
    batches = list(batches)
    ledger = Ledger(model, budget)
    order, history = [], []
    while not ledger.met:  # one block at a time, each chosen with the earlier ones removed
        more, ppl = next_block(model, batches, ledger, order)
        order.append(more)
        history.append(ppl)
        ledger.take_block(more)
    return ledger.plan("sleb", info={"blocks_removed": order, "calibration_perplexity_after": history,
                                     "metric": "calibration perplexity after removal",
                                     "seconds": time.perf_counter() - start})


def next_block(model: nn.Module, batches, ledger: Ledger, removed: list[int]) -> tuple[int, float]:
    """(the next block SLEB removes after ``removed``, the calibration perplexity without it and them)."""
    layers = sorted({s.layer for s in ledger.sites.values()} - set(removed))
    if not layers:
        raise ConfigError(f"budget={ledger.share}: removing every block removes {ledger.removed} of the "
                          f"{ledger.target} parameters asked for")
    tried = {layer: perplexity_without(model, batches, ledger, removed + [layer]) for layer in layers}
    best = min(tried, key=lambda layer: (tried[layer], layer))
    return best, tried[best]
