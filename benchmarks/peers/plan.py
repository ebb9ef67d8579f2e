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

from headprune import find_ffns, find_sites, prune_heads, prune_neurons
from headprune.compression.fingerprint import fingerprint
from headprune.compression.replay import Plan, plan_of
from headprune.core.biases import output_projections, shift_biases
from headprune.core.sites import kv_of_heads
from headprune.core.verify import verify_surgery
from headprune.errors import ConfigError, UnsupportedModelError


def nonembedding_params(model: nn.Module) -> int:
    """Parameters of ``model`` other than its input and output embeddings (tied weights counted once)."""
    skip = set()
    for emb in (model.get_input_embeddings(), model.get_output_embeddings()):
        if emb is not None:
            skip.update(id(p) for p in emb.parameters())
    seen = {id(p): p for p in model.parameters()}
    return sum(p.numel() for k, p in seen.items() if k not in skip)


def check_llama_like(model: nn.Module) -> None:
    """The peers read q/k/v/o and gate/up/down as separate ``nn.Linear`` layers (Llama, Qwen2, Mistral)."""
    sites, ffns = find_sites(model), find_ffns(model)
    if not sites or not ffns:
        raise UnsupportedModelError(f"{type(model).__name__}: the peers need attention sites and FFNs; found "
                                    f"{len(sites)} sites, {len(ffns)} FFNs")
    for s in sites:
        if s.meta.get("fused") or not all(isinstance(m, nn.Linear) for m in (s.q.module, s.k.module, s.v.module, s.o)):
            raise UnsupportedModelError(f"site {s.name}: the peers need separate nn.Linear q/k/v/o projections")
    if {s.layer for s in sites} != {f.layer for f in ffns} or len(sites) != len(ffns):
        raise UnsupportedModelError("the peers need one self-attention site and one FFN per layer")


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


class Ledger:
    """Exact running count of the non-embedding parameters a plan removes, against its target.

    ``bias=True``: the first unit taken from an output projection without a bias adds one (FLAP), and its
    width counts against the units removed.
    """

    def __init__(self, model: nn.Module, share: float, *, bias: bool = False):
        if not 0 < share < 1:
            raise ConfigError(f"budget={share!r}; allowed: a share of non-embedding parameters in (0, 1)")
        check_llama_like(model)
        self.model = model
        self.total = nonembedding_params(model)
        self.share = share
        self.target = math.ceil(share * self.total)
        self.removed = 0
        self.bias = bias
        self.sites = {s.name: s for s in find_sites(model)}
        self.ffns = {f.name: f for f in find_ffns(model)}
        self.paths = {id(m): n for n, m in model.named_modules()}
        self.groups = {n: kv_of_heads(s) for n, s in self.sites.items()}
        self.heads: dict[str, set[int]] = {n: set() for n in self.sites}
        self.neurons: dict[str, set[int]] = {n: set() for n in self.ffns}
        self.biased: set[str] = set()
        self.layer_of = {**{n: s.layer for n, s in self.sites.items()}, **{n: f.layer for n, f in self.ffns.items()}}

    # prices
    def q_cost(self, site: str) -> int:
        s = self.sites[site]
        q, o = s.q.module, s.o
        return s.head_dim * (q.in_features + (q.bias is not None) + o.out_features)

    def kv_cost(self, site: str) -> int:
        s = self.sites[site]
        return sum(s.head_dim * (p.module.in_features + (p.module.bias is not None)) for p in (s.k, s.v))

    def neuron_cost(self, ffn: str) -> int:
        f = self.ffns[ffn]
        return sum(u.in_features + (u.bias is not None) for u in f.ups) + f.down.out_features

    def layer_pool(self, layer: int) -> int:
        """Parameters the units of ``layer`` hold: its site's q/k/v/o (not the output bias) and FFN neurons."""
        out = 0
        for n, s in self.sites.items():
            if s.layer == layer:
                out += s.num_heads * self.q_cost(n) + s.num_kv_heads * self.kv_cost(n)
        for n, f in self.ffns.items():
            if f.layer == layer:
                out += f.width * self.neuron_cost(n)
        return out

    def _bias_cost(self, module: nn.Module) -> int:
        path = self.paths[id(module)]
        if not self.bias or path in self.biased or module.bias is not None:
            return 0
        return module.out_features

    def head_cost(self, site: str, h: int) -> int:
        """Net parameters removed by taking query head ``h`` of ``site`` now."""
        g = self.groups[site]
        last = all(j in self.heads[site] for j in range(len(g)) if g[j] == g[h] and j != h)
        return self.q_cost(site) + (self.kv_cost(site) if last else 0) - self._bias_cost(self.sites[site].o)

    # taking units
    def take_head(self, site: str, h: int) -> None:
        if h in self.heads[site]:
            return
        self.removed += self.head_cost(site, h)
        self.heads[site].add(h)
        self._mark(self.sites[site].o)

    def take_neuron(self, ffn: str, j: int) -> None:
        if j in self.neurons[ffn]:
            return
        down = self.ffns[ffn].down
        self.removed += self.neuron_cost(ffn) - self._bias_cost(down)
        self.neurons[ffn].add(j)
        self._mark(down)

    def take_block(self, layer: int) -> None:
        """Every query head and every neuron of ``layer``: the block removed (its residual branches add nothing)."""
        for n, s in self.sites.items():
            if s.layer == layer:
                for h in range(s.num_heads):
                    self.take_head(n, h)
        for n, f in self.ffns.items():
            if f.layer == layer:
                for j in range(f.width):
                    self.take_neuron(n, j)

    def _mark(self, module: nn.Module) -> None:
        if self.bias:
            self.biased.add(self.paths[id(module)])

    @property
    def met(self) -> bool:
        return self.removed >= self.target

    def take_in_order(self, order: list[tuple[str, str, int]]) -> None:
        """Take ``(kind, name, index)`` units (kind ``head`` or ``neuron``) in order until the target is met."""
        for kind, name, i in order:
            if self.met:
                return
            (self.take_head if kind == "head" else self.take_neuron)(name, i)
        if not self.met:
            raise ConfigError(f"budget={self.share}: removing every unit offered removes {self.removed} of the "
                              f"{self.target} parameters asked for")

    def plan(self, method: str, biases: dict[str, torch.Tensor] | None = None, info: dict | None = None, *,
             weights: dict[str, torch.Tensor] | None = None) -> Plan:
        """The units taken, with ``biases`` and ``weights`` (:func:`peer_plan`), as headprune's plan."""
        return peer_plan(self.model, method, {k: sorted(v) for k, v in self.heads.items() if v},
                         {k: sorted(v) for k, v in self.neurons.items() if v}, biases=biases, weights=weights,
                         info={**(info or {}), "budget": self.share, "nonembedding_params": self.total,
                               "target_removed": self.target, "planned_removed": self.removed})


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
