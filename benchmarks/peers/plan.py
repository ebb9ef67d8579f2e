"""What every peer produces -- headprune's :class:`~headprune.compression.replay.Plan` -- and how it is priced.

A peer drops query heads per attention site and neurons per FFN (indices among the unpruned model's units,
headprune's site and FFN names) and may add biases to output projections (FLAP); second-order methods (SlimGPT,
OSSCAR) also replace output / down projection weights (their refit kept columns) before the cut.
:func:`peer_plan` turns that into headprune's plan (the cut with headprune's surgery, :func:`cut`: a key/value
head goes when its last query head goes; a site without heads leaves its output bias, plus the tensors the
peer rewrote), and ``headprune.compression.replay.apply_plan`` replays it, as ``headprune apply`` does a
compression's: every method shares one mechanism. A whole block goes as every head and every neuron of its layer
(:meth:`Ledger.take_block`): the attention and the FFN then add nothing to the residual stream, which is the
block removed (SLEB, ShortGPT); only its two norm vectors stay, counted as kept.

Budgets are a share ``b`` of the model's non-embedding parameters (every parameter but the input and output
embeddings) removed. :class:`Ledger` prices units exactly as surgery removes them: a query head costs its
query rows and output columns, plus its key/value rows when it is the last query head of its group; a
neuron costs its up/gate rows and its down column; a bias added to a bias-less projection costs its width.
Each method takes units in its own order until ``removed >= ceil(b x params)``, so methods differ from the
target by less than one unit (uniform methods: less than one neuron per layer).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from headprune import prune_heads, prune_neurons
from headprune.compression.fingerprint import fingerprint
from headprune.compression.replay import Plan, plan_of
from headprune.core.cut.biases import output_projections, shift_biases
from headprune.core.safety.verify import verify_surgery
from headprune.errors import ConfigError
from headprune.peers.ledger import Ledger as _Ledger
from headprune.peers.ledger import check_llama_like, nonembedding_params  # noqa: F401  (the peers import them here)


def peer_plan(model: nn.Module, method: str, heads: dict[str, list[int]], neurons: dict[str, list[int]], *,
              biases: dict[str, torch.Tensor] | None = None, weights: dict[str, torch.Tensor] | None = None,
              info: dict | None = None) -> Plan:
    """headprune's :class:`~headprune.compression.replay.Plan` of a peer: on a copy of ``model``, ``weights``
    ({o_proj / down_proj path: [d_out, C] weight at the unpruned width}) set, ``biases`` ({path: [d_out]}) added
    (a projection without one gets one), then ``heads`` and ``neurons`` cut (indices among the unpruned units); the
    plan holds what that copy differs in from ``model`` only cut. ``model`` is not changed; a weight of another
    shape, or a bias for a projection no unit feeds, is refused before any work."""
    weights, biases = weights or {}, biases or {}
    for path, weight in weights.items():
        shape = tuple(model.get_submodule(path).weight.shape)
        if tuple(weight.shape) != shape:
            raise ConfigError(f"plan weight for {path!r} has shape {tuple(weight.shape)}; allowed: the unpruned {shape}")
    paths = {id(m): n for n, m in model.named_modules()}
    names = {paths[id(m)]: name for name, m in output_projections(model).items()}
    if unknown := [p for p in biases if p not in names]:
        raise ConfigError(f"plan bias for {unknown[0]!r}; allowed: an output projection ({', '.join(names)})")
    made_on = fingerprint(model)
    pruned = copy.deepcopy(model)
    with torch.no_grad():
        for path, weight in weights.items():
            linear = pruned.get_submodule(path)
            linear.weight.copy_(weight.to(linear.weight.dtype).to(linear.weight.device))
    shift_biases(pruned, {names[p]: b.to(pruned.get_submodule(p).weight.dtype) for p, b in biases.items()})
    cut(pruned, heads, neurons)
    return plan_of(model, pruned, heads, neurons, made_on=made_on, info={"method": method, **(info or {})})


def cut(model: nn.Module, heads: dict[str, list[int]], neurons: dict[str, list[int]]) -> nn.Module:
    """headprune's surgery on ``model`` in place (verified for its class first): the heads, then the neurons (a
    key/value head goes when its last query head goes; a site without heads leaves its output bias)."""
    heads, neurons = {k: v for k, v in heads.items() if v}, {k: v for k, v in neurons.items() if v}
    verify_surgery(model, ("heads", "neurons"))
    if heads:
        prune_heads(model, heads, verify=False)  # verified above
    if neurons:
        prune_neurons(model, neurons, verify=False)
    return model


class Ledger(_Ledger):
    """:class:`headprune.peers.ledger.Ledger` (the exact running count of what a plan removes, shared with the
    library's FLAP) that builds headprune's :class:`~headprune.compression.replay.Plan` (:func:`peer_plan`)."""

    def __init__(self, model: nn.Module, share: float, *, bias: bool = False):
        super().__init__(model, share, bias=bias)
        self.model = model

    def plan(self, method: str, biases: dict[str, torch.Tensor] | None = None, info: dict | None = None, *,
             weights: dict[str, torch.Tensor] | None = None) -> Plan:
        """The units taken, with ``biases`` and ``weights`` (:func:`peer_plan`), as headprune's plan."""
        heads, neurons = self.dropped()
        return peer_plan(self.model, method, heads, neurons, biases=biases, weights=weights,
                         info={**(info or {}), **self.bookkeeping()})


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
