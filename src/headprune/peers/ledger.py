"""The budget the peers share: a share of a model's non-embedding parameters, priced exactly as surgery removes them.

:class:`Ledger` keeps the running count: a query head costs its query rows and output columns, plus its
key/value rows when it is the last query head of its group; a neuron costs its up/gate rows and its down
column; a bias added to a bias-less projection (FLAP's compensation) costs its width. A method takes units
in its own order until ``removed >= ceil(b x params)``, so it differs from the target by less than one unit.
What it took is plain data (:meth:`Ledger.dropped`: query heads per site, neurons per FFN, indices among
the unpruned model's units), from which any plan object is built.
"""

from __future__ import annotations

import math

from torch import nn

from ..core.model.ffn import find_ffns
from ..core.model.sites import find_sites, kv_of_heads
from ..errors import ConfigError, UnsupportedModelError


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


class Ledger:
    """Exact running count of the non-embedding parameters a plan removes, against its target.

    ``bias=True``: the first unit taken from an output projection without a bias adds one (FLAP), and its
    width counts against the units removed.
    """

    def __init__(self, model: nn.Module, share: float, *, bias: bool = False):
        if not 0 < share < 1:
            raise ConfigError(f"budget={share!r}; allowed: a share of non-embedding parameters in (0, 1)")
        check_llama_like(model)
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

    def dropped(self) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """({site: query heads taken}, {ffn: neurons taken}), sorted, the sites / FFNs that lost nothing left out."""
        return ({k: sorted(v) for k, v in self.heads.items() if v},
                {k: sorted(v) for k, v in self.neurons.items() if v})

    def bookkeeping(self) -> dict:
        """The budget's numbers (JSON-ready): share asked, non-embedding parameters, target and planned removal."""
        return {"budget": self.share, "nonembedding_params": self.total, "target_removed": self.target,
                "planned_removed": self.removed}

    def take_in_order(self, order: list[tuple[str, str, int]]) -> None:
        """Take ``(kind, name, index)`` units (kind ``head`` or ``neuron``) in order until the target is met."""
        for kind, name, i in order:
            if self.met:
                return
            (self.take_head if kind == "head" else self.take_neuron)(name, i)
        if not self.met:
            raise ConfigError(f"budget={self.share}: removing every unit offered removes {self.removed} of the "
                              f"{self.target} parameters asked for")
