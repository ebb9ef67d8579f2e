"""A minimal LoRA (Hu et al., ICLR 2022) for the recovery benchmark (``benchmarks/recovery.py``): the recovery
LLM-Pruner runs after its pruning (Ma, Fang & Wang, NeurIPS 2023, ``post_training.py``: PEFT's LoRA of rank 8,
alpha 16 on q/k/v/o/gate/up/down, trained with the language-modelling loss), written here without PEFT.

Each wrapped ``nn.Linear`` computes ``W x + b + (alpha / r) * B (A x)``, ``A`` [r, in] initialised as PEFT does
(Kaiming-uniform with ``a = sqrt(5)``), ``B`` [out, r] zeros, so a fresh adapter changes nothing; only ``A`` and
``B`` train. :func:`merge_lora` folds ``(alpha / r) * B A`` into ``W`` and puts the plain ``nn.Linear`` back, so
the merged model is the architecture the pruning produced (no dropout: the adapters run in eval mode).
"""

from __future__ import annotations

import math

import torch
from torch import nn

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """``base(x) + scale * x A^T B^T`` with ``base`` frozen."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0):
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank={rank}; allowed: an integer >= 1")
        self.base, self.rank, self.scale = base, rank, alpha / rank
        w = base.weight
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=w.device, dtype=w.dtype))  # [r, in]
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=w.device, dtype=w.dtype))  # [out, r]
        if self.lora_a.numel():  # a projection surgery emptied has nothing to initialise
            nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale

    def merged(self) -> nn.Linear:
        """The base Linear with ``scale * B A`` added to its weight (in place)."""
        with torch.no_grad():
            self.base.weight += (self.lora_b @ self.lora_a) * self.scale  # [out, in]
        return self.base


def add_lora(model: nn.Module, rank: int = 8, alpha: float = 16.0, targets=TARGETS) -> list[nn.Parameter]:
    """Wrap every ``nn.Linear`` named in ``targets`` (by its attribute name) in a :class:`LoRALinear`; freeze
    every other parameter; returns the adapters' parameters (the only ones that train)."""
    for p in model.parameters():
        p.requires_grad_(False)
    found = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if name in targets and isinstance(child, nn.Linear)]
    if not found:
        raise ValueError(f"targets={list(targets)}: no nn.Linear of these names in {type(model).__name__}")
    params = []
    for parent, name, child in found:
        wrapped = LoRALinear(child, rank, alpha)
        setattr(parent, name, wrapped)
        params += [wrapped.lora_a, wrapped.lora_b]
    return params


def merge_lora(model: nn.Module) -> int:
    """Fold every adapter into its Linear and unwrap it; returns how many were merged."""
    found = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, LoRALinear)]
    for parent, name, child in found:
        setattr(parent, name, child.merged())
    return len(found)
