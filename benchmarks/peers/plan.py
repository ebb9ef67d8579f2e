"""What every peer produces -- a :class:`Plan` -- and the one way it is applied and priced.

A plan drops query heads per attention site and neurons per FFN (indices among the unpruned model's units,
headprune's site and FFN names) and may add biases to output projections (FLAP). :func:`apply_plan` applies
it with headprune's surgery (``headprune.prune_heads`` / ``headprune.prune_neurons``: a key/value head goes
when its last query head goes; a site without heads leaves its output bias), so every method shares one
mechanism. Second-order methods (SlimGPT, OSSCAR) also replace output / down projection weights (their
refit kept columns) before the cut. A whole block goes as every head and every neuron of its layer
(:meth:`Ledger.take_block`): the attention and the FFN then add nothing to the residual stream, which is the
block removed (SLEB, ShortGPT); only its two norm vectors stay, counted as kept.

Budgets are a share ``b`` of the model's non-embedding parameters (every parameter but the input and output
embeddings) removed, counted by the library's :class:`headprune.peers.ledger.Ledger` (FLAP, which lives in
the library for the demo, shares it): units priced exactly as surgery removes them, taken in each method's
order until ``removed >= ceil(b x params)``, so methods differ from the target by less than one unit (uniform
methods: less than one neuron per layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from headprune import prune_heads, prune_neurons
from headprune.core.verify import verify_surgery
from headprune.errors import ConfigError
from headprune.peers.ledger import Ledger as _Ledger
from headprune.peers.ledger import check_llama_like, nonembedding_params  # noqa: F401  (the peers import them here)


@dataclass
class Plan:
    """Units a method removes, and the biases it adds (module path -> [d_out] tensor)."""

    method: str
    heads: dict[str, list[int]]  # {site: query heads dropped, indices among the unpruned site's heads}
    neurons: dict[str, list[int]]  # {ffn: neurons dropped, indices among the unpruned FFN's neurons}
    biases: dict[str, torch.Tensor] = field(default_factory=dict)  # {o_proj / down_proj path: bias added}
    info: dict = field(default_factory=dict)  # method settings and budget bookkeeping (JSON-ready)
    # {o_proj / down_proj path: [d_out, C] weight at the unpruned width, set before surgery} (SlimGPT, OSSCAR)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)

    def counts(self) -> dict:
        return {"heads": sum(map(len, self.heads.values())), "neurons": sum(map(len, self.neurons.values())),
                "biases": len(self.biases), "weights": len(self.weights)}


def apply_plan(model: nn.Module, plan: Plan, *, verify: bool = True) -> nn.Module:
    """Apply ``plan`` to ``model`` in place: biases first (so a site left without heads keeps its bias),
    then headprune's surgery. ``verify`` runs headprune's trial of the model's class before any change."""
    if verify:
        verify_surgery(model, ("heads", "neurons"))
    for path, weight in plan.weights.items():  # checked before anything changes
        shape = tuple(model.get_submodule(path).weight.shape)
        if tuple(weight.shape) != shape:
            raise ConfigError(f"plan weight for {path!r} has shape {tuple(weight.shape)}; allowed: the unpruned {shape}")
    with torch.no_grad():
        for path, weight in plan.weights.items():
            linear = model.get_submodule(path)
            linear.weight.copy_(weight.to(linear.weight.dtype).to(linear.weight.device))
        for path, bias in plan.biases.items():
            linear = model.get_submodule(path)
            value = bias.to(linear.weight.dtype).to(linear.weight.device)
            if linear.bias is None:
                linear.bias = nn.Parameter(value.clone())
            else:
                linear.bias += value
    heads = {k: v for k, v in plan.heads.items() if v}
    neurons = {k: v for k, v in plan.neurons.items() if v}
    if heads:
        prune_heads(model, heads, verify=False)  # verified above
    if neurons:
        prune_neurons(model, neurons, verify=False)
    return model


class Ledger(_Ledger):
    """:class:`headprune.peers.ledger.Ledger` (the exact running count of what a plan removes) that builds a
    :class:`Plan`."""

    def plan(self, method: str, biases: dict[str, torch.Tensor] | None = None, info: dict | None = None) -> Plan:
        heads, neurons = self.dropped()
        return Plan(method, heads, neurons, biases or {}, {**(info or {}), **self.bookkeeping()})


def uniform_layer(ledger: Ledger, layer: int, share: float, attention: list[tuple[float, list[int]]],
                  site: str, ffn: str, neuron_scores: torch.Tensor, n_attention: int) -> None:
    """One layer of a uniform method: take the ``n_attention`` lowest attention units (each a score and the
    query heads it holds: one head, or a key/value group), then the lowest neurons until the layer has lost
    ``share`` of :meth:`Ledger.layer_pool` (to the next whole neuron). Where even every neuron would not
    reach the share, the next attention units are taken first."""
    start = ledger.removed
    goal = share * ledger.layer_pool(layer)
    ranked = sorted(attention, key=lambda t: t[0])
    width, cost = ledger.ffns[ffn].width, ledger.neuron_cost(ffn)
    taken = 0
    while True:
        for _, heads in ranked[taken:n_attention]:
            for h in heads:
                ledger.take_head(site, h)
        taken = max(taken, min(n_attention, len(ranked)))
        need = max(0, math.ceil((goal - (ledger.removed - start)) / cost))
        if need <= width:
            break
        if n_attention >= len(ranked):
            raise ConfigError(f"budget={ledger.share}: layer {layer} cannot lose {share:.0%} of its parameters")
        n_attention += 1
    for j in torch.argsort(neuron_scores, stable=True)[:need].tolist():
        ledger.take_neuron(ffn, j)


def layer_pairs(ledger: Ledger) -> list[tuple[int, str, str]]:
    """(layer, site, ffn) in layer order."""
    ffn_of = {f.layer: n for n, f in ledger.ffns.items()}
    return sorted((s.layer, n, ffn_of[s.layer]) for n, s in ledger.sites.items())
