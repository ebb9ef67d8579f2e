"""The one FLOP counter: what a model (and each of its heads) costs per example, from its shapes.

One forward of one random example (``[1, seq_len]`` tokens; ``[1, tgt_len]`` decoder tokens for
encoder-decoders) with a counting hook on every Linear / GPT-2 Conv1D records how many rows
(tokens) each one sees; a Linear costs ``rows * in * out`` multiply-accumulates (MACs). Attention
sites add their two products per head, ``QK^T`` and ``AV``: ``2 * heads * head_dim * T_q * T_k`` MACs,
with ``T_q`` and ``T_k`` the rows their query and key projections saw (full ``T x T``, no causal
halving). A pruned site has smaller q/k/v/o matrices and fewer heads; a removed site costs nothing.
Embedding lookups, norms, softmax and other elementwise work are not counted. FLOPs = 2 x MACs.

Per head (:func:`head_costs`, for budgets): a query head costs its rows of the query projection,
its columns of the output projection and its two attention products; a key/value head costs its
rows of the key and value projections and is paid once while any query head that reads it is kept
(surgery removes it with its last query head). The prices add up exactly: a pruned model's
attention FLOPs are :meth:`HeadCosts.cost` of what it keeps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ...checks import check_choice
from ...errors import ConfigError
from .inputs import example_inputs, unwrap
from .sites import find_sites, is_conv1d, kv_of_heads

FLOP_KINDS = ("flops", "macs")


def linear_rows(model: nn.Module, seq_len: int, *, tgt_len: int | None = None) -> dict[nn.Module, int]:
    """{Linear / Conv1D module: rows (tokens) it sees in one example's forward} -- the counter's hook."""
    model = unwrap(model)
    rows: dict[nn.Module, int] = {}

    def count(module, args, _out):
        rows[module] = rows.get(module, 0) + math.prod(args[0].shape[:-1])  # tokens (0-wide inputs too)

    linears = {id(m): m for m in model.modules() if isinstance(m, nn.Linear) or is_conv1d(m)}
    handles = [m.register_forward_hook(count) for m in linears.values()]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(**example_inputs(model, 1, seq_len, tgt_len=tgt_len))
    except (IndexError, RuntimeError, ValueError) as e:
        limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
        raise ConfigError(f"seq_len={seq_len}, tgt_len={tgt_len}: the model cannot run one example of this length "
                          f"(max_position_embeddings={limit}): {e}") from None
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {m: rows.get(m, 0) for m in linears.values()}


def flop_breakdown(model: nn.Module, seq_len: int, *, tgt_len: int | None = None, kind: str = "flops") -> dict[str, int]:
    """{'projections': q/k/v/o of attention sites, 'attention': QK^T and AV, 'other': every other Linear,
    'total'} for one example, in FLOPs or MACs (``kind``)."""
    check_choice("kind", kind, FLOP_KINDS)
    model = unwrap(model)
    rows = linear_rows(model, seq_len, tgt_len=tgt_len)
    proj: set[int] = set()
    attention = 0
    for s in find_sites(model):
        mods = [compute_module(p.module) for p in (s.q, s.k, s.v)] + [compute_module(s.o)]
        proj.update(id(m) for m in mods)
        attention += 2 * s.num_heads * s.head_dim * rows.get(mods[0], 0) * rows.get(mods[1], 0)
    macs = {"projections": 0, "other": 0}
    for m, n in rows.items():
        macs["projections" if id(m) in proj else "other"] += n * m.weight.numel()
    macs["attention"] = attention
    scale = 2 if kind == "flops" else 1
    out = {k: scale * v for k, v in macs.items()}
    out["total"] = sum(out.values())
    return out


def flops_per_example(model: nn.Module, seq_len: int, *, tgt_len: int | None = None, kind: str = "flops") -> int:
    """Matmul FLOPs (``kind="flops"``, 2 per multiply-accumulate) or MACs of one example's forward."""
    return flop_breakdown(model, seq_len, tgt_len=tgt_len, kind=kind)["total"]


@dataclass
class HeadCosts:
    """FLOPs per example: ``head`` {site: [H]} of each query head's own work, ``kv`` {site: FLOPs of one
    key/value head}, ``group`` {site: [H] key/value head each query head reads}."""

    head: dict[str, torch.Tensor]
    kv: dict[str, float]
    group: dict[str, list[int]]

    @classmethod
    def additive(cls, costs: Mapping[str, torch.Tensor]) -> HeadCosts:
        """Plain per-head costs (no shared key/value heads)."""
        head = {k: torch.as_tensor(v, dtype=torch.float64).flatten() for k, v in costs.items()}
        return cls(head, {k: 0.0 for k in head}, {k: list(range(v.numel())) for k, v in head.items()})

    def cost(self, kept: Mapping[str, Iterable[int]]) -> float:
        """Attention FLOPs of keeping ``kept`` ({site: heads}; sites left out keep nothing)."""
        total = 0.0
        for name, heads in kept.items():
            heads = set(int(h) for h in heads)
            total += float(self.head[name][sorted(heads)].sum()) + self.kv[name] * len({self.group[name][h] for h in heads})
        return total

    def total(self) -> float:
        return self.cost({name: range(h.numel()) for name, h in self.head.items()})

    def per_head(self) -> dict[str, torch.Tensor]:
        """Each head's price with the key/value heads shared out evenly (an estimate under GQA)."""
        return {name: h + self.kv[name] * len(set(self.group[name])) / h.numel() for name, h in self.head.items()}


def head_costs(model: nn.Module, seq_len: int = 128, *, tgt_len: int | None = None) -> HeadCosts:
    """The attention FLOPs of every head of ``model`` as it is now (see the module doc)."""
    rows = linear_rows(model, seq_len, tgt_len=tgt_len)
    head, kv, group = {}, {}, {}
    for s in find_sites(unwrap(model)):
        q, k, o = compute_module(s.q.module), compute_module(s.k.module), compute_module(s.o)
        t_q, t_k, t_o = rows.get(q, 0), rows.get(k, 0), rows.get(o, 0)
        hd = s.head_dim
        macs = t_q * in_features(q) * hd + t_o * hd * out_features_of(o) + 2 * hd * t_q * t_k
        head[s.name] = torch.full((s.num_heads,), 2.0 * macs, dtype=torch.float64)
        kv[s.name] = 2.0 * 2 * t_k * in_features(k) * hd  # key and value rows of one key/value head
        group[s.name] = kv_of_heads(s)
    return HeadCosts(head, kv, group)


def compute_module(module: nn.Module) -> nn.Module:
    """The Linear that does a projection's work (RepeatHeads computes with its base Linear)."""
    return getattr(module, "base", module)


def in_features(module: nn.Module) -> int:
    return module.weight.shape[0] if is_conv1d(module) else module.weight.shape[1]


def out_features_of(module: nn.Module) -> int:
    return module.weight.shape[1] if is_conv1d(module) else module.weight.shape[0]
