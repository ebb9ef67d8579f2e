"""What each prunable unit costs: FLOPs per example at a sequence length, or parameters, per head and
per FFN neuron -- the prices of one budget over both (:mod:`headprune.selection.units`).

FLOPs come from the one FLOP counter (:mod:`.cost`): a head's price is :meth:`HeadCosts.per_head`
(its q/o rows and columns, its two attention products, and under GQA its share of the key/value
heads); a neuron's is ``2 x rows x (d_in per up/gate projection + d_out of the down projection)``,
with ``rows`` the tokens its FFN sees in one example (``seq_len``; ``tgt_len`` in a decoder).
Parameters: a head's rows/columns of q/k/v/o (key/value shared out under GQA) and their biases; a
neuron's row (and bias) of every up/gate projection and its column of the down projection.
Latency prices come from a table measured on the machine (:mod:`headprune.bench.unit_latency`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...checks import check_choice
from .cost import compute_module, head_costs, linear_rows
from .ffn import find_ffns, in_features, out_features
from .inputs import unwrap
from .sites import find_sites, site_params

PRICES = ("flops", "params")


@dataclass
class UnitCosts:
    """Price of one unit: ``heads`` {site: [H]} and ``neurons`` {ffn: [width]} (float64), in ``unit``."""

    heads: dict[str, torch.Tensor]
    neurons: dict[str, torch.Tensor]
    unit: str  # flops | params | seconds
    # {site: price of one key/value head}, shared out evenly in ``heads``; paid in full only when its group of
    # query heads empties (None: unknown, e.g. measured seconds). Lets a GQA search price its steps exactly.
    kv: dict[str, float] | None = None

    def total(self) -> float:
        return float(sum(v.sum() for v in (*self.heads.values(), *self.neurons.values())))


def unit_costs(model: nn.Module, price: str = "flops", *, seq_len: int = 128, tgt_len: int | None = None) -> UnitCosts:
    """FLOPs per example (``price="flops"``, at ``seq_len`` / ``tgt_len``) or parameters of every head and
    neuron of ``model`` as it is now."""
    check_choice("price", price, PRICES)
    model = unwrap(model)
    if price == "flops":
        hc = head_costs(model, seq_len, tgt_len=tgt_len)
        heads = hc.per_head()
        rows = linear_rows(model, seq_len, tgt_len=tgt_len)
        neurons = {}
        for f in find_ffns(model, skip_moe=True):
            macs = sum(rows.get(compute_module(u), 0) * in_features(u) for u in f.ups)
            macs += rows.get(f.down, 0) * out_features(f.down)
            neurons[f.name] = torch.full((f.width,), 2.0 * macs, dtype=torch.float64)
        return UnitCosts(heads, neurons, "flops", kv={k: float(v) for k, v in hc.kv.items()})
    sites = find_sites(model)
    heads = {s.name: torch.full((s.num_heads,), site_params(s) / max(s.num_heads, 1), dtype=torch.float64)
             for s in sites}  # bias of the output projection shared out: a small overestimate
    kv = {s.name: _kv_head_params(s) for s in sites}
    neurons = {}
    for f in find_ffns(model, skip_moe=True):
        per = sum(in_features(u) + (1 if getattr(u, "bias", None) is not None else 0) for u in f.ups)
        neurons[f.name] = torch.full((f.width,), float(per + out_features(f.down)), dtype=torch.float64)
    return UnitCosts(heads, neurons, "params", kv=kv)


def _kv_head_params(site) -> float:
    """Parameters of one key/value head: its key and value rows (and biases); 0 for a fused projection, whose
    rows the per-head share already counts."""
    k, v = site.k.module, site.v.module
    if k is site.q.module or v is site.q.module or k is v or site.num_kv_heads == 0:
        return 0.0
    return float(sum(p.numel() for m in (k, v) for p in m.parameters())) / site.num_kv_heads
