"""ShortGPT: whole blocks removed by their Block Influence (Men, Xu, Zhang, Lin, Lu, Han & Chen, "ShortGPT:
Layers in Large Language Models are More Redundant Than You Expect", arXiv 2403.03853, 2024; re-implemented
from the paper, nothing copied).

Block Influence of block ``i``: ``BI_i = 1 - E_{x, t} cos(x_in_t, x_out_t)``, the mean over every calibration
token ``t`` of one minus the cosine between the hidden state entering the block and the one leaving it, from
one forward pass of the unpruned model. The blocks of lowest BI go (one shot), until the non-embedding
parameters removed reach the target (:meth:`peers.plan.Ledger.take_block`; as SLEB, less than one block over).

A block is found by structure, not by class name: the deepest module that holds both the layer's output
projection and its FFN's down projection; its input is the first positional argument or ``hidden_states``,
its output the tensor or the first element of the tuple it returns.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from headprune.core.model.devices import input_device, to_device
from headprune.errors import ConfigError

from .plan import Ledger, Plan


def blocks(model: nn.Module, ledger: Ledger) -> dict[int, nn.Module]:
    """{layer: the deepest module containing both its site's output projection and its FFN's down projection}."""
    out = {}
    for s in ledger.sites.values():
        ffn = next(f for f in ledger.ffns.values() if f.layer == s.layer)
        a, b = ledger.paths[id(s.o)].split("."), ledger.paths[id(ffn.down)].split(".")
        common = []
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            common.append(x)
        out[s.layer] = model.get_submodule(".".join(common))
    return out


@torch.no_grad()
def block_influence(model: nn.Module, batches, ledger: Ledger) -> dict[int, float]:
    """{layer: BI}: one minus the mean cosine of each token's hidden state into and out of the block."""
    sums: dict[int, list] = {}

    def hook(layer):
        def record(_m, args, kwargs, out):
            x = args[0] if args else kwargs["hidden_states"]
            y = out[0] if isinstance(out, tuple) else out
            cos = torch.nn.functional.cosine_similarity(x.double(), y.double(), dim=-1)  # [B, T]
            acc = sums.setdefault(layer, [0.0, 0])
            acc[0] += float(cos.sum())
            acc[1] += cos.numel()
        return record

    handles = [m.register_forward_hook(hook(layer), with_kwargs=True) for layer, m in blocks(model, ledger).items()]
    was_training = model.training
    model.eval()
    try:
        device = input_device(model)
        for batch in batches:
            model(**to_device({k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}, device),
                  use_cache=False)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {layer: 1 - s / n for layer, (s, n) in sorted(sums.items())}


def shortgpt_plan(model: nn.Module, batches, budget: float) -> Plan:
    """ShortGPT's plan: the blocks of lowest Block Influence, until ``budget`` of the non-embedding params go."""
    start = time.perf_counter()
    ledger = Ledger(model, budget)
    influence = block_influence(model, list(batches), ledger)
    order = sorted(influence, key=lambda layer: (influence[layer], layer))
    taken = []
    for layer in order:
        if ledger.met:
            break
        ledger.take_block(layer)
        taken.append(layer)
    if not ledger.met:
        raise ConfigError(f"budget={budget}: removing every block removes {ledger.removed} of the {ledger.target} "
                          "parameters asked for")
    return ledger.plan("shortgpt", info={"blocks_removed": taken,
                                         "block_influence": {str(k): v for k, v in influence.items()},  # JSON keys
                                         "seconds": time.perf_counter() - start})
