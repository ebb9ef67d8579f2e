"""The evaluation protocol every row shares: perplexity over non-overlapping windows, a paired bootstrap of
the ratio pruned / unpruned, and the sizes of a model (parameters, FLOPs and KV cache per token).

Perplexity, as the LLM-pruning papers report it (FLAP, Wanda, LLM-Pruner, SparseGPT evaluate WikiText-2 the
same way): the evaluation text is tokenized once, without special tokens, cut into non-overlapping windows of
``T`` tokens (the tail shorter than a window is dropped), each window run alone; perplexity is
``exp(sum of token NLLs / tokens predicted)``. Since issue #47 every window starts with the model's prefix token
(BOS, else EOS, as lm-evaluation-harness starts its rolling windows) followed by ``T - 1`` text tokens, all
predicted; results files record it as ``prefix_token`` (files without it were measured on plain windows, the
first token of every window unpredicted).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from headprune.core.model.chunked import token_outputs
from headprune.core.model.cost import flop_breakdown
from headprune.core.model.devices import input_device
from headprune.core.model.kvcache import kv_cache_bytes
from headprune.evaluation.lm import cut_blocks

from .plan import nonembedding_params


def windows(ids: list[int], size: int, limit: int | None = None, prefix: int | None = None) -> torch.Tensor:
    """[N, size] non-overlapping windows of ``ids`` (at most ``limit``), each starting with the token ``prefix``
    (the model's BOS, else EOS; then ``size - 1`` text tokens per window) when one is given: headprune's own
    block cutter (:func:`headprune.evaluation.lm.cut_blocks`), so the harness measures as the LM task does."""
    return cut_blocks(ids, size, prefix, limit)


@torch.no_grad()
def window_nll(model: nn.Module, blocks: torch.Tensor, batch_size: int = 4) -> dict[str, list]:
    """{"nll_sum": per window, "tokens": per window} of ``model`` on ``blocks`` [N, T]: the loss chunk by chunk over
    the tokens (:mod:`headprune.core.model.chunked`), so a 262,144-token vocabulary never holds ``[B, T, V]`` logits (a
    Gemma-3 window of 2048 tokens would take 8.6 GB in float32 at batch 4)."""
    model.eval()
    device = input_device(model)
    nll, tokens = [], []
    for i in range(0, blocks.shape[0], batch_size):
        x = blocks[i: i + batch_size].to(device)
        out = token_outputs(model, {"input_ids": x, "attention_mask": torch.ones_like(x), "use_cache": False})
        token_nll = out.shifted().token_nll(x[:, 1:]).float()  # [B, T-1], chunk by chunk: never [B, T, V] at once
        if not torch.isfinite(token_nll).all():
            raise FloatingPointError("non-finite token losses")
        nll += token_nll.double().sum(1).tolist()
        tokens += [x.shape[1] - 1] * x.shape[0]
    return {"nll_sum": nll, "tokens": tokens}


def perplexity(result: dict) -> float:
    return math.exp(sum(result["nll_sum"]) / sum(result["tokens"]))


def ratio_interval(base: dict, pruned: dict, *, resamples: int = 1000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float, float]:
    """Perplexity ratio pruned / unpruned over the same windows, and its paired percentile bootstrap interval at
    ``level`` (windows resampled with replacement, the same windows for both models)."""
    b, p = np.asarray(base["nll_sum"]), np.asarray(pruned["nll_sum"])
    t = np.asarray(base["tokens"])
    if not np.array_equal(t, np.asarray(pruned["tokens"])):
        raise ValueError("the two evaluations are not over the same windows")

    def ratio(idx):
        return math.exp((p[idx].sum() - b[idx].sum()) / t[idx].sum())

    rng = np.random.default_rng(seed)
    k = len(b)
    boots = [ratio(rng.integers(0, k, k)) for _ in range(resamples)]
    tail = 50 * (1 - level)
    return ratio(np.arange(k)), float(np.percentile(boots, tail)), float(np.percentile(boots, 100 - tail))


def sizes(model: nn.Module, seq_len: int = 128) -> dict:
    """Parameters (all, non-embedding), matmul FLOPs per token of one ``seq_len``-token sequence (headprune's
    counter: linear layers and the two attention products), KV-cache bytes per token."""
    flops = flop_breakdown(model, seq_len)["total"]
    return {"params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
            "nonembedding_params": nonembedding_params(model), "flops_per_token": flops / seq_len,
            "flops_seq_len": seq_len, "kv_cache_bytes_per_token": kv_cache_bytes(model)["per_token"]}
