"""LLM-Pruner's block-wise Taylor criterion without LoRA recovery (Ma, Fang & Wang, "LLM-Pruner: On the
Structural Pruning of Large Language Models", NeurIPS 2023; code github.com/horseee/LLM-Pruner, ``hf_prune.py``,
``llama3.py`` and ``LLMPruner/pruner/hf_llama_pruner.py`` ``TaylorImportance``; read, not copied).

Its defaults (``hf_prune.py --block_wise --pruner_type taylor``): ``--taylor param_first``,
``--grouping_strategy sum``, no ``--global_pruning`` (the same ratio in every pruned layer), one iterative
step, and ``--block_attention_layer_start 3 --block_attention_layer_end 31`` (same for the MLP) on the
32-layer LLaMA-7B: the first 3 layers and the last one are never pruned. Here: layers ``[3, L - 1)`` of an
``L``-layer model (the README's own LLaMA-7B command uses ``4..30`` instead).

- Salience of every weight: ``|w * dL/dw|`` (``param_first``), with ``dL/dw`` the gradient of the mean
  next-token loss over the calibration batches (its default: 10 examples of 64 tokens; here the harness's one
  calibration set, the same for every method).
- A group's importance is the sum (``sum`` aggregation) over its coupled weights: an FFN channel's row of
  gate_proj and up_proj and column of down_proj; an attention head's rows of q/k/v_proj and columns of o_proj
  (``consecutive_groups = head_dim``). Under GQA (``llama3.py`` roots the groups at ``k_proj``) the unit is a
  key/value group: its k/v rows plus the q rows and o columns of every query head that reads it.
- In each pruned layer the lowest ``C - int(C * (1 - ratio))`` channels of the root go, in whole heads
  (``// head_dim``), as the code's ``MetaPruner`` counts them.

Budget matching (stated): ``ratio = target / parameters of the pruned layers' units``; attention units by the
code's formula, then each pruned layer's lowest FFN channels until the layer has lost ``ratio`` of its
parameters (to the next whole channel), so the total meets the non-embedding target like every other method.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from headprune.core.model.devices import input_device, to_device
from headprune.errors import ConfigError

from .plan import Ledger, Plan, layer_pairs, uniform_layer

FIRST, LAST = 3, 1  # layers kept unpruned at the start and the end (hf_prune.py's defaults on 32 layers)


def taylor_salience(model: nn.Module, batches) -> dict[nn.Parameter, torch.Tensor]:
    """{weight: |w * dL/dw|} for every Linear weight, ``L`` the mean token loss over all ``batches``."""
    batches = list(batches)
    tokens = [int((b["labels"][:, 1:] != -100).sum()) for b in batches]
    total = sum(tokens)
    flags = {p: p.requires_grad for p in model.parameters()}
    was_training = model.training
    model.eval()
    linears = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    wanted = {id(w) for w in linears}
    try:
        for p in model.parameters():
            p.requires_grad_(id(p) in wanted)
            p.grad = None
        device = input_device(model)
        for batch, n in zip(batches, tokens, strict=True):
            x = to_device({k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}, device)
            (model(**x, use_cache=False).loss * (n / total)).backward()
        return {w: (w.detach() * w.grad).abs() for w in linears if w.grad is not None}
    finally:
        for p, flag in flags.items():
            p.grad = None
            p.requires_grad_(flag)
        model.train(was_training)


def group_scores(ledger: Ledger, salience: dict) -> tuple[dict, dict]:
    """({site: [(score, query heads)] per attention unit}, {ffn: [width] neuron scores}): summed salience."""
    attention, neurons = {}, {}
    for n, s in ledger.sites.items():
        hd = s.head_dim
        q = salience[s.q.module.weight].sum(1).view(s.num_heads, hd).sum(1)  # [H] rows
        o = salience[s.o.weight].sum(0).view(s.num_heads, hd).sum(1)  # [H] columns
        kv = sum(salience[p.module.weight].sum(1).view(s.num_kv_heads, hd).sum(1) for p in (s.k, s.v))  # [KV]
        groups = ledger.groups[n]
        if s.num_kv_heads == s.num_heads:
            attention[n] = [(float(q[h] + o[h] + kv[groups[h]]), [h]) for h in range(s.num_heads)]
        else:
            attention[n] = [(float(kv[g] + sum(q[h] + o[h] for h in range(s.num_heads) if groups[h] == g)),
                             [h for h in range(s.num_heads) if groups[h] == g]) for g in range(s.num_kv_heads)]
    for n, f in ledger.ffns.items():
        neurons[n] = sum(salience[u.weight].sum(1) for u in f.ups) + salience[f.down.weight].sum(0)  # [width]
    return attention, neurons


def llm_pruner_plan(model: nn.Module, batches, budget: float, *, first: int = FIRST, last: int = LAST) -> Plan:
    """LLM-Pruner's (Taylor, block-wise, no LoRA) plan removing ``budget`` of the non-embedding parameters."""
    start = time.perf_counter()
    ledger = Ledger(model, budget)
    pairs = layer_pairs(ledger)
    n_layers = len(pairs)
    pruned = [p for p in pairs if first <= p[0] < n_layers - last]
    if not pruned:
        raise ConfigError(f"llm-pruner: {n_layers} layers leave none between the first {first} and the last {last} "
                          "it keeps")
    ratio = ledger.target / sum(ledger.layer_pool(layer) for layer, _, _ in pruned)
    if ratio >= 1:
        raise ConfigError(f"budget={budget}: layers {pruned[0][0]}..{pruned[-1][0]} hold too few parameters "
                          f"(ratio {ratio:.2f} of each)")
    attention, neurons = group_scores(ledger, taylor_salience(model, batches))
    for layer, site, ffn in pruned:
        s = ledger.sites[site]
        root = s.num_kv_heads if s.num_kv_heads != s.num_heads else s.num_heads  # heads of the root projection
        channels = root * s.head_dim
        units = (channels - int(channels * (1 - ratio))) // s.head_dim
        uniform_layer(ledger, layer, ratio, attention[site], site, ffn, neurons[ffn], units)
    return ledger.plan("llm-pruner", info={"taylor": "param_first", "grouping": "sum", "ratio_per_layer": ratio,
                                           "pruned_layers": [p[0] for p in pruned], "kept_first": first,
                                           "kept_last": last, "gqa_unit": "key/value group",
                                           "lora": False, "seconds": time.perf_counter() - start})
