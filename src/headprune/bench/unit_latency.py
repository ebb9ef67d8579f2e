"""Latency prices of heads and FFN neurons, from a small table measured once on the target machine.

Kwon et al. 2022 price units by a per-layer latency lookup table. Here the table has three rows, all
timed in one alternated run (:func:`.timing.benchmark`) at the batch size and length that matter:
the model as it is, the model with half the neurons of every FFN removed, and with half the heads of
every site removed. The time each half saved, divided by the units removed, is the price of one
neuron and of one head (seconds per batch; every neuron one price, every head one price, so Kwon et
al.'s search is exact on them). Latency is not exactly additive in units (matmul kernels have
sweet spots), so these are slopes around half width; a slope the noise makes <= 0 is refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from ..core.model.ffn import find_ffns
from ..core.model.sites import find_sites
from ..core.model.unit_cost import UnitCosts
from ..core.prune import prune_heads, prune_neurons
from ..errors import ConfigError
from .settings import BenchSettings
from .timing import benchmark

Timer = Callable[[dict[str, nn.Module]], dict[str, float]]  # {name: model} -> {name: seconds per batch}


def latency_table(model: nn.Module, *, batch: int = 16, seq_len: int = 128, tgt_len: int | None = None,
                  repeats: int = 5, timer: Timer | None = None) -> dict:
    """{"seconds": {full, ffn_half, heads_half}, "removed": {neurons, heads}, settings} for ``model``."""
    ffn_half, heads_half = copy.deepcopy(model), copy.deepcopy(model)
    neurons = {f.name: list(range(f.width // 2)) for f in find_ffns(ffn_half)}
    heads = {s.name: list(range(s.num_heads // 2)) for s in find_sites(heads_half)}
    prune_neurons(ffn_half, neurons)
    prune_heads(heads_half, heads, verify=False)
    models = {"full": model, "ffn_half": ffn_half, "heads_half": heads_half}
    if timer is None:
        def timer(ms):
            result = benchmark(ms, BenchSettings(batch_sizes=(batch,), seq_len=seq_len, tgt_len=tgt_len,
                                                 repeats=repeats, memory=False))
            return {r["model"]: r["latency_s"] for r in result.runs}
    seconds = timer(models)
    return {"seconds": {k: float(seconds[k]) for k in models},
            "removed": {"neurons": sum(map(len, neurons.values())), "heads": sum(map(len, heads.values()))},
            "batch": batch, "seq_len": seq_len, "tgt_len": tgt_len}


def latency_prices(model: nn.Module, table: dict | None = None, **kwargs) -> UnitCosts:
    """Seconds per batch of every head and neuron of ``model``, from ``table`` (measured now when None)."""
    table = table or latency_table(model, **kwargs)
    t, n = table["seconds"], table["removed"]
    per = {}
    for kind, half in (("neurons", "ffn_half"), ("heads", "heads_half")):
        saved = t["full"] - t[half]
        if n[kind] and saved <= 0:
            raise ConfigError(f"latency table: removing half the {kind} did not make the model faster ({t['full']:.4g} s "
                              f"-> {t[half]:.4g} s); the machine is too noisy to price {kind} by latency; allowed: "
                              "more repeats, a quieter machine, or price='flops'")
        per[kind] = saved / n[kind] if n[kind] else 0.0
    heads = {s.name: torch.full((s.num_heads,), per["heads"], dtype=torch.float64) for s in find_sites(model)}
    neurons = {f.name: torch.full((f.width,), per["neurons"], dtype=torch.float64) for f in find_ffns(model)}
    return UnitCosts(heads, neurons, "seconds")
