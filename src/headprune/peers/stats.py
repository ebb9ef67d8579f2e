"""Per-channel statistics of the inputs of chosen linear layers over calibration tokens.

FLAP and Wanda-sp both read the input ``X [tokens, C]`` of each output projection (o_proj: the heads'
outputs concatenated) and down projection (the FFN's neurons): FLAP its per-channel mean and variance over
tokens, Wanda-sp its per-channel norm ``||X_j||_2``. Sums are kept in float64 over every token of every
calibration batch (blocks without padding, as the harness builds them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..core.model.devices import input_device, to_device


@dataclass
class ChannelStats:
    tokens: int
    sum: torch.Tensor  # [C] float64: sum over tokens of X[:, j]
    sumsq: torch.Tensor  # [C] float64: sum over tokens of X[:, j]^2

    @property
    def mean(self) -> torch.Tensor:  # [C]
        return self.sum / self.tokens

    @property
    def var(self) -> torch.Tensor:  # [C] population variance over tokens
        return (self.sumsq / self.tokens - self.mean.pow(2)).clamp_min(0)

    @property
    def norm(self) -> torch.Tensor:  # [C] ||X[:, j]||_2
        return self.sumsq.sqrt()


class StopForward(Exception):
    """Raised by a hook to end a forward pass once the last module of interest has run."""


@torch.no_grad()
def input_stats(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], modules: Mapping[str, nn.Module],
                *, stop_after: nn.Module | None = None) -> dict[str, ChannelStats]:
    """{name: statistics of the input of ``modules[name]``} over ``batches`` (model inputs). ``stop_after``:
    end each forward once this module has run (the layers above it are not needed)."""
    acc: dict[str, list] = {}

    def hook(name):
        def record(_module, args, _out):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()  # [tokens, C]
            if name not in acc:
                acc[name] = [0, torch.zeros(x.shape[1], dtype=torch.float64, device=x.device),
                             torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)]
            acc[name][0] += x.shape[0]
            acc[name][1] += x.sum(0)
            acc[name][2] += x.pow(2).sum(0)
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in modules.items()]
    if stop_after is not None:
        def stop(*_):
            raise StopForward
        handles.append(stop_after.register_forward_hook(stop))
    was_training = model.training
    model.eval()
    try:
        device = input_device(model)
        for batch in batches:
            x = to_device({k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}, device)
            try:
                model(**x, use_cache=False)
            except StopForward:
                pass
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {n: ChannelStats(int(t), s.cpu(), q.cpu()) for n, (t, s, q) in acc.items()}
