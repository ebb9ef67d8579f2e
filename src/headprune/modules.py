"""The two small modules surgery puts into a model in place of what it removes."""

from __future__ import annotations

import torch
from torch import nn


class RepeatHeads(nn.Module):
    """Key/value projection of a grouped-query site whose kept query heads are unevenly spread.

    ``base`` computes only the kept key/value heads; ``index`` [out_heads] names, for each head the
    attention sees, which base head it is. Surgery keeps groups as large as it can (the gcd of the
    kept query heads per key/value head), so a head is repeated only where GQA cannot express the
    plan. Weights are never copied: the parameter count is that of the kept heads.
    """

    def __init__(self, base: nn.Linear, index: torch.Tensor, head_dim: int):
        super().__init__()
        self.base = base
        self.head_dim = head_dim
        self.register_buffer("index", index.to(torch.long), persistent=False)  # [out_heads]

    @property
    def num_base_heads(self) -> int:
        return self.base.out_features // self.head_dim

    @property
    def out_features(self) -> int:
        return self.index.numel() * self.head_dim

    @property
    def weight(self) -> torch.Tensor:  # lets dtype/device probes treat it like a Linear
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out_heads * head_dim]
        y = self.base(x).unflatten(-1, (self.num_base_heads, self.head_dim))  # [..., base_heads, hd]
        return y.index_select(-2, self.index).flatten(-2)


class BiasOnly(nn.Module):
    """What an output projection leaves when every head it reads is removed: its bias (or zeros)."""

    def __init__(self, bias: torch.Tensor | None, out_features: int):
        super().__init__()
        self.out_features = out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=bias.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., 0] -> [..., out]
        shape = (*x.shape[:-1], self.out_features)
        if self.bias is None:
            return x.new_zeros(shape)
        bias = self.bias.to(x.dtype)
        # under no_grad a view of a parameter still reports requires_grad (without a grad_fn), which trips
        # autograd-graph tools (FlopCounterMode, ModuleTracker): detach unless gradients are wanted
        return (bias if torch.is_grad_enabled() else bias.detach()).expand(shape)

    def extra_repr(self) -> str:
        return f"out_features={self.out_features}, bias={self.bias is not None}"
