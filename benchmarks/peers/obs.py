"""Second-order removal of input groups of a linear layer, shared by SlimGPT (:mod:`peers.slimgpt`) and OSSCAR
(:mod:`peers.osscar`), and the layer-by-layer driver both run on the already-pruned model's inputs.

A consumer layer ``y = W x`` (``W``: ``[d_out, C]``; o_proj's ``C`` = heads x head_dim, down_proj's = neurons)
loses the input columns of the groups it drops (a head's ``head_dim`` columns, a neuron's one). Over the
calibration inputs ``X`` ``[tokens, C]``, with ``H = X^T X + lam I`` (``lam = damping x mean diag(X^T X)``, as
SparseGPT/SlimGPT damp), the kept columns ``K`` are refit to

    min_{W'_K} 1/2 ||X_K W'_K^T - X W^T||^2 + lam/2 ||W'_K - W_K||^2 + lam/2 ||W_R||^2,

whose solution is the structured Optimal Brain Surgeon step (Hassibi & Stork 1993; Frantar & Alistarh's OBC):
removing group ``Q`` from the current weights costs ``1/2 tr(W_Q [Hinv_QQ]^-1 W_Q^T)`` (``Hinv = H^-1`` over
the columns still kept) and the kept columns move by ``-W_Q [Hinv_QQ]^-1 Hinv_Q,:``; ``Hinv`` is then
downdated by the Schur complement, so each later step is again exact for the smaller set. The objective of
a kept set ``S`` in closed form, ``f(S) = 1/2 tr(W0 H W0^T) - 1/2 tr(G_S^T H_SS^-1 G_S)`` with
``G = H W0^T``, is what OSSCAR's local search compares (:func:`objective`, :func:`swap_costs`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import nn

from headprune import find_ffns, find_sites, prune_heads, prune_neurons
from headprune.core.model.devices import input_device, to_device
from headprune.errors import ConfigError
from headprune.peers.stats import StopForward

from .plan import Ledger, layer_pairs

# remover(W [d_out, C] float64, H [C, C] float64 damped, groups [n, g] column indices, k) -> (dropped groups, W')
Remover = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[list[int], torch.Tensor]]


@torch.no_grad()
def gram(model: nn.Module, batches, module: nn.Module) -> tuple[torch.Tensor, int]:
    """(``X^T X`` [C, C] float64, tokens) of ``module``'s input over ``batches``; each forward stops after it."""
    acc: list = []

    def record(_m, args, _out):
        x = args[0].detach().reshape(-1, args[0].shape[-1]).double()  # [tokens, C]
        if not acc:
            acc.extend([torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device=x.device), 0])
        acc[0] += x.T @ x
        acc[1] += x.shape[0]
        raise StopForward

    handle = module.register_forward_hook(record)
    was_training = model.training
    model.eval()
    try:
        device = input_device(model)
        for batch in batches:
            try:
                model(**to_device({k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}, device),
                      use_cache=False)
            except StopForward:
                pass
    finally:
        handle.remove()
        model.train(was_training)
    return acc[0].cpu(), int(acc[1])


def damped(xtx: torch.Tensor, damping: float) -> torch.Tensor:
    """``X^T X + damping x mean(diag) I`` (a dead column gets the damping alone, so ``H`` stays invertible)."""
    power = float(xtx.diagonal().mean())
    lam = damping * power if power > 0 else damping
    h = xtx.clone()
    h.diagonal().add_(lam if lam > 0 else 1e-12)
    return h


def head_groups(num_heads: int, head_dim: int) -> torch.Tensor:
    """[num_heads, head_dim]: the o_proj columns of each head."""
    return torch.arange(num_heads * head_dim).view(num_heads, head_dim)


def obs_cost(w: torch.Tensor, hinv: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``1/2 tr(W_Q [Hinv_QQ]^-1 W_Q^T)`` for ``cols`` [n, g]: the objective increase of removing each group."""
    return block_cost(w[:, cols].permute(1, 0, 2), hinv[cols.unsqueeze(-1), cols.unsqueeze(-2)])


def block_cost(w_q: torch.Tensor, hinv_qq: torch.Tensor) -> torch.Tensor:
    """[n]: ``1/2 tr(W_Q [Hinv_QQ]^-1 W_Q^T)`` from the groups' columns ``w_q`` [n, d_out, g] and ``Hinv``
    blocks ``hinv_qq`` [n, g, g]."""
    if hinv_qq.shape[-1] == 1:  # single columns (neurons): a division, much faster than n batched 1x1 solves
        return 0.5 * w_q[:, :, 0].pow(2).sum(1) / hinv_qq[:, 0, 0]
    sol = torch.linalg.solve(hinv_qq, w_q.transpose(1, 2))  # [n, g, d_out]
    return 0.5 * (w_q.transpose(1, 2) * sol).sum((1, 2))


def obs_remove(w: torch.Tensor, hinv: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W', Hinv'), in place: the columns ``cols`` [q] removed with the OBS update of the others, ``Hinv``
    downdated by its Schur complement (no [C, C] temporary: the update is one in-place ``addmm``)."""
    rows = hinv[cols]  # [q, C] (a copy)
    sol = torch.linalg.solve(rows[:, cols], rows)  # [q, C] = [Hinv_QQ]^-1 Hinv_Q,:
    w.addmm_(w[:, cols], sol, alpha=-1)
    hinv.addmm_(rows.T, sol, alpha=-1)
    w[:, cols] = 0
    hinv[cols] = 0
    hinv[:, cols] = 0
    return w, hinv


def greedy_remove(w: torch.Tensor, h: torch.Tensor, groups: torch.Tensor, k: int,
                  batch: Callable[[int], int] = lambda left: 1) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(dropped groups in order, W', Hinv'): ``k`` groups removed greedily by their OBS cost, ``batch(left)`` of
    the cheapest at a time (one by default), with the OBS update after each step."""
    hinv = torch.linalg.inv(h)
    w = w.clone()
    alive = list(range(groups.shape[0]))
    dropped: list[int] = []
    while len(dropped) < k:
        costs = obs_cost(w, hinv, groups[alive])
        take = torch.argsort(costs, stable=True)[: max(1, min(batch(k - len(dropped)), k - len(dropped)))]
        chosen = [alive[i] for i in take.tolist()]
        w, hinv = obs_remove(w, hinv, groups[chosen].flatten())
        dropped += chosen
        alive = [g for g in alive if g not in chosen]
    return dropped, w, hinv


def objective(w0: torch.Tensor, h: torch.Tensor, kept: torch.Tensor) -> float:
    """``f(S)`` for the kept columns ``kept``: the refit's objective, in closed form."""
    g = h @ w0.T  # [C, d_out]
    g_s = g[kept]
    fit = (g_s * torch.linalg.solve(h[kept][:, kept], g_s)).sum() if kept.numel() else 0.0
    return float(0.5 * ((w0 @ h) * w0).sum() - 0.5 * fit)


def refit(w0: torch.Tensor, h: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """W' [d_out, C]: the kept columns set to the least-squares optimum ``G_S^T H_SS^-1``, the others zero."""
    out = torch.zeros_like(w0)
    if kept.numel():
        out[:, kept] = torch.linalg.solve(h[kept][:, kept], (h @ w0.T)[kept]).T
    return out


def layerwise(model: nn.Module, batches, ledger: Ledger, shares: list[float], heads: Remover, neurons: Remover,
              damping: float, heads_of: Callable[[float, int], int] = lambda share, n: int(share * n)
              ) -> dict[str, torch.Tensor]:
    """Prune layer by layer on a copy, each projection's inputs recorded on the model already pruned below it
    (the site first, then the FFN on inputs after the site's cut): ``heads_of(share, H)`` heads (default
    ``int(share x H)``) of the layer by
    ``heads`` (more where even all but one neuron would not reach the share), then neurons by ``neurons`` until the layer has lost ``share`` of :meth:`Ledger.layer_pool` (to
    the next whole neuron). Units go into ``ledger``; returns {o_proj / down_proj path: W' [d_out, C] at the
    unpruned width}, the weights :func:`peers.plan.peer_plan` sets before surgery.

    The calibration inputs of each layer's block are kept (:class:`BlockInputs`, as SparseGPT's sequential
    driver): a projection's inputs come from running its block alone on them, and the pruned block's outputs
    are the next block's inputs, so the whole model runs once, not once per projection."""
    work = copy.deepcopy(model)
    weights = {}
    cache = BlockInputs(work, batches, ledger)
    for (layer, site, ffn), share in zip(layer_pairs(ledger), shares, strict=True):
        start, goal = ledger.removed, share * ledger.layer_pool(layer)
        s = {x.name: x for x in find_sites(work)}[site]
        n_heads = min(s.num_heads, heads_of(share, s.num_heads))
        width, cost = ledger.ffns[ffn].width, ledger.neuron_cost(ffn)
        while n_heads < s.num_heads and n_heads * ledger.q_cost(site) + (width - 1) * cost < goal:
            n_heads += 1  # the neurons alone cannot reach the layer's share: more heads first (as uniform_layer)
        if n_heads:
            w_new, drop = _consumer(cache.gram(layer, s.o), s.o, head_groups(s.num_heads, s.head_dim), n_heads,
                                    heads, damping)
            weights[ledger.paths[id(ledger.sites[site].o)]] = w_new
            for h in drop:
                ledger.take_head(site, h)
            prune_heads(work, {site: drop}, verify=False)  # an untouched site: original indices
        f = {x.name: x for x in find_ffns(work)}[ffn]
        need = max(0, math.ceil((goal - (ledger.removed - start)) / ledger.neuron_cost(ffn)))
        if need >= f.width:
            raise ConfigError(f"budget={ledger.share}: layer {layer} would lose all {f.width} neurons "
                              f"(share {share:.2f}); allowed: a budget that leaves each layer some")
        if need:
            w_new, drop = _consumer(cache.gram(layer, f.down), f.down, torch.arange(f.width).view(-1, 1), need,
                                    neurons, damping)
            weights[ledger.paths[id(ledger.ffns[ffn].down)]] = w_new
            for j in drop:
                ledger.take_neuron(ffn, j)
            prune_neurons(work, {ffn: drop}, verify=False)
        cache.advance(layer)
    del work, cache
    return weights


class BlockInputs:
    """The calibration inputs of one transformer block at a time, per batch: caught once at the first block
    (its positional and keyword arguments: hidden states, mask, position embeddings), then each block's outputs,
    run on the (pruned) block alone, are the next block's inputs. Between blocks a Llama-like model does
    nothing else, so these are the inputs a forward of the whole model would give the block."""

    def __init__(self, work: nn.Module, batches, ledger: Ledger):
        from .shortgpt import blocks

        paths = {id(m): n for n, m in work.named_modules()}
        self.work = work
        self.paths = {layer: paths[id(b)] for layer, b in blocks(work, ledger).items()}  # ledger's names, work's blocks
        first = work.get_submodule(self.paths[min(self.paths)])
        self.inputs: list[tuple[tuple, dict]] = []

        def catch(_m, args, kwargs):
            self.inputs.append((args, kwargs))
            raise StopForward

        handle = first.register_forward_pre_hook(catch, with_kwargs=True)
        was_training = work.training
        work.eval()
        try:
            device = input_device(work)
            with torch.no_grad():
                for batch in batches:
                    try:
                        work(**to_device({k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")},
                                         device), use_cache=False)
                    except StopForward:
                        pass
        finally:
            handle.remove()
            work.train(was_training)

    def block(self, layer: int) -> nn.Module:
        return self.work.get_submodule(self.paths[layer])

    @torch.no_grad()
    def gram(self, layer: int, module: nn.Module) -> torch.Tensor:
        """``X^T X`` [C, C] float64 of ``module``'s input (inside block ``layer``) over the batches."""
        acc: list = []

        def record(_m, args, _out):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()  # [tokens, C]
            if not acc:
                acc.append(torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device=x.device))
            acc[0] += x.T @ x
            raise StopForward

        handle = module.register_forward_hook(record)
        block = self.block(layer)
        was_training = block.training
        block.eval()
        try:
            for args, kwargs in self.inputs:
                try:
                    block(*args, **kwargs)
                except StopForward:
                    pass
        finally:
            handle.remove()
            block.train(was_training)
        return acc[0].cpu()

    @torch.no_grad()
    def advance(self, layer: int) -> None:
        """Replace the inputs with block ``layer``'s outputs (the next block's inputs)."""
        block = self.block(layer)
        was_training = block.training
        block.eval()
        out = []
        for args, kwargs in self.inputs:
            y = block(*args, **kwargs)
            y = y[0] if isinstance(y, tuple) else y
            out.append(((y, *args[1:]), kwargs) if args else ((), {**kwargs, "hidden_states": y}))
        block.train(was_training)
        self.inputs = out


def _consumer(xtx: torch.Tensor, module, groups, k, remover: Remover, damping) -> tuple[torch.Tensor, list[int]]:
    """Refit ``module`` (in place) with ``k`` of its input ``groups`` removed by ``remover``, from its inputs'
    ``X^T X``; returns (W' float64 on CPU, dropped groups sorted)."""
    w0 = module.weight.detach().double().cpu()
    drop, w_new = remover(w0, damped(xtx, damping), groups, k)
    with torch.no_grad():
        module.weight.copy_(w_new.to(module.weight.dtype))
    return w_new, sorted(drop)
