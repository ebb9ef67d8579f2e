"""SLEB: whole transformer blocks removed one at a time by the calibration perplexity after removal (Song, Oh,
Kim, Kim & Kim, "SLEB: Streamlining LLMs through Redundancy Verification and Elimination of Transformer
Blocks", ICML 2024, arXiv 2402.09025; code github.com/jiwonsong-dev/SLEB; re-implemented from the paper,
nothing copied).

SLEB's loop: with the blocks chosen so far removed, try removing each remaining block, compute the
perplexity of the calibration text, and remove for good the block whose removal gives the lowest; repeat
until enough blocks are gone. Each candidate is evaluated on the model with the block's every head and
neuron masked (headprune's masks), which is that block removed: its attention and FFN add nothing to the
residual stream (no output biases in the Llama family; a bias would be the only difference, and
:func:`peers.plan.cut` keeps a removed site's output bias exactly as the mask does). The blocks below a
candidate give the same outputs whichever candidate is tried, so each step records them once and each
candidate's pass replays them (about half the compute of a full pass per candidate, the same numbers).

Budget (stated): blocks are taken in SLEB's order until the non-embedding parameters removed reach the
target (:meth:`peers.plan.Ledger.take_block`), so SLEB overshoots the target by less than one block (a
block is ``1/L`` of the model: the coarsest unit of all methods). Its two norm vectors stay and count as
kept. Calibration: the harness's batches, the same as every method's (the paper: 128 WikiText-2 samples of
2048 tokens).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import torch
from torch import nn

from headprune import masked, masked_neurons
from headprune.core.model.devices import input_device, to_device
from headprune.errors import ConfigError

from .plan import Ledger, Plan
from .shortgpt import blocks


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


class _Replay(nn.Module):
    """Stands in for a block below the candidate: returns, batch after batch, the outputs the block gave in this
    step's recording pass (with the same blocks removed below it, so the same outputs), without computing."""

    def __init__(self, block: nn.Module, outputs: list):
        super().__init__()
        object.__setattr__(self, "_block", block)  # not a submodule: the model's parameters stay the block's
        self.outputs = outputs
        self.calls = 0

    def forward(self, *args, **kwargs):
        out = self.outputs[self.calls]
        self.calls += 1
        return out

    def __getattr__(self, name):  # attributes the model's loop reads from a block (e.g. its attention type)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_block"), name)


def block_slots(model: nn.Module, ledger: Ledger) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, block) of each layer's block, in layer order (:func:`peers.shortgpt.blocks`)."""
    paths = {id(m): n for n, m in model.named_modules()}
    out = []
    for _, block in sorted(blocks(model, ledger).items()):
        parent, _, name = paths[id(block)].rpartition(".")
        out.append((model.get_submodule(parent), name, block))
    return out


@contextmanager
def replayed(slots: list, outputs: dict[int, list]):
    """Within the block, ``slots`` (the blocks below a candidate) replay ``outputs`` {slot position: per batch}."""
    for i, (parent, name, block) in enumerate(slots):
        setattr(parent, name, _Replay(block, outputs[i]))
    try:
        yield
    finally:
        for parent, name, block in slots:
            setattr(parent, name, block)


@torch.no_grad()
def _record(model: nn.Module, batches, slots: list) -> dict[int, list]:
    """{slot position: [the block's output per batch]} in one pass of ``model`` as it is (masks applied)."""
    outputs: dict[int, list] = {i: [] for i in range(len(slots))}
    handles = [block.register_forward_hook(lambda _m, _a, out, i=i: outputs[i].append(out))
               for i, (_, _, block) in enumerate(slots)]
    try:
        calibration_nll(model, batches)
    finally:
        for h in handles:
            h.remove()
    return outputs


def sleb_plan(model: nn.Module, batches, budget: float, *, max_batches: int | None = None) -> Plan:
    """SLEB's plan: whole blocks removed in its order until ``budget`` of the non-embedding parameters is gone.
    ``max_batches``: score the candidates on the first batches only (a cost cap; None: every batch)."""
    start = time.perf_counter()
    batches = list(batches)[:max_batches]
    ledger = Ledger(model, budget)
    order, history = [], []
    while not ledger.met:  # one block at a time, each chosen with the earlier ones removed
        more, ppl = next_block(model, batches, ledger, order)
        order.append(more)
        history.append(ppl)
        ledger.take_block(more)
    return ledger.plan("sleb", info={"blocks_removed": order, "calibration_perplexity_after": history,
                                     "metric": "calibration perplexity after removal",
                                     "calibration_batches": len(batches),
                                     "seconds": time.perf_counter() - start})


def next_block(model: nn.Module, batches, ledger: Ledger, removed: list[int]) -> tuple[int, float]:
    """(the next block SLEB removes after ``removed``, the calibration perplexity without it and them).

    One pass with ``removed`` masked records every block's output; each candidate's pass then replays the
    blocks below it (their outputs do not depend on the candidate) and computes only the candidate and above."""
    order = sorted({s.layer for s in ledger.sites.values()})
    layers = [layer for layer in order if layer not in removed]
    if not layers:
        raise ConfigError(f"budget={ledger.share}: removing every block removes {ledger.removed} of the "
                          f"{ledger.target} parameters asked for")
    slots = block_slots(model, ledger)
    was_training = model.training
    model.eval()
    tried = {}
    try:
        with masked(model, block_masks(ledger, removed)[0]), masked_neurons(model, block_masks(ledger, removed)[1]):
            outputs = _record(model, batches, slots)
        for layer in layers:
            heads, neurons = block_masks(ledger, removed + [layer])
            below = slots[:order.index(layer)]
            with masked(model, heads), masked_neurons(model, neurons), replayed(below, outputs):
                total, tokens = calibration_nll(model, batches)
            tried[layer] = math.exp(total / tokens)
    finally:
        model.train(was_training)
    best = min(tried, key=lambda layer: (tried[layer], layer))
    return best, tried[best]
