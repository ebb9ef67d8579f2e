"""Kwon et al.'s post-training pruning of encoders, re-implemented: Woosuk Kwon, Sehoon Kim, Michael W. Mahoney,
Joseph Hassoun, Kurt Keutzer and Amir Gholami, "A Fast Post-Training Pruning Framework for Transformers",
NeurIPS 2022; code github.com/WoosukKwon/retraining-free-pruning (``prune/fisher.py``, ``prune/search.py``
``search_mac``, ``prune/rearrange.py``, ``prune/rescale.py``, ``utils/linalg.py``, ``main.py``; read, not
copied). Written against the model's own modules (BERT-style post-LayerNorm encoders: ``attention.output``
and ``output`` each add a projection to the residual and normalise); headprune is used only to find the
attention sites and FFNs, to price units (:func:`headprune.core.model.unit_cost.unit_costs`, the same FLOP counter
headprune's own budget uses) and for the final physical surgery (:func:`peers.plan.cut`).

The four steps, as the public code runs them:

1. **Fisher of the masks** (:func:`mask_gradients`): a mask variable per head (multiplying its slice of the
   output projection's input) and per FFN neuron (multiplying its input of the down projection), all ones;
   gradients of the model's own task loss on calibration data; ``F_i = sum_x g_i(x)^2``.
2. **Mask search** under a FLOPs constraint (:func:`search`, their Algorithm 1): heads and neurons each
   ranked globally by Fisher; for every number of kept heads ``h``, the ``h`` best heads and as many of the
   best neurons as the remaining FLOPs pay for; the pair with the largest kept Fisher wins.
3. **Mask rearrangement** (:func:`rearrange`, per layer, for heads and neurons separately): with the
   block-diagonal Fisher ``F_l = sum_x g_l(x) g_l(x)^T`` the loss of pruning the set ``S`` is about
   ``sum_x (sum_{i in S} g_i(x))^2``; start from the ``|S|`` units with the smallest diagonal, then for each
   other unit in increasing diagonal order add it to ``S`` and take out the member whose removal leaves the
   smallest sum.
4. **Mask tuning** (:func:`tune`, layer by layer, bottom up): the kept heads' mask values of a layer are
   refitted so that its attention block's pre-LayerNorm output (the residual plus the projection)
   reproduces the teacher's, in least squares over the calibration tokens (padding removed), with one
   extra constant column solved for and dropped; then the kept neurons' values likewise for the FFN block
   (for a classifier, the last layer's FFN fits the first token only). The normal equations ``A^T A x =
   A^T b`` are solved for ``x - 1`` by LSMR with ``damp=1`` (a ridge towards the unit mask); a solve that
   does not converge or gives a value outside [-10, 10] ends tuning for this and every later layer. The
   first layer's heads are not tuned. The teacher is the mask the search finds at ``sqrt(constraint)``
   (their ``get_pruning_schedule(target, num_iter=2)[0]``), not rearranged; ``teacher_share=1`` makes it
   the unpruned model. The tuned values are folded into the output / down projections' columns, and the
   zero-mask heads and neurons are removed by headprune's surgery.

Differences, stated: gradients are per example (the code's are per mini-batch of 32); units are priced by
headprune's FLOP counter at ``seq_len`` (for BERT the same per-head ``4 T d d_h + 2 T^2 d_h`` and per-neuron
``2 T d`` multiply-accumulates as their ``efficiency/mac.py``, times 2), and a number of heads whose FLOPs
alone exceed the constraint is skipped (the code would still score it, with no neurons); LSMR is SciPy's
(theirs CuPy's, the same algorithm) run to ``atol = btol = 1e-12`` (the code's default ``1e-6`` can stop
with a solution a few percent away from the least-squares one); sums are in float64.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.sparse.linalg import lsmr
from torch import nn

from headprune import find_ffns, find_sites
from headprune.core.model.unit_cost import unit_costs
from headprune.errors import ConfigError, UnsupportedModelError

from .plan import cut

MAX_SCALE = 10.0  # the code's bound on a tuned mask value
TOL = 1e-12  # LSMR's atol / btol (the code keeps the default 1e-6, which can stop with the solution 1e-2 off)


@dataclass
class Layer:
    """One encoder layer as Kwon's code sees it: the attention site and FFN headprune finds, and the
    LayerNorms their output / down projections feed (with the residual)."""

    index: int
    site: object  # headprune Site
    ffn: object  # headprune FFN
    ln_attention: nn.Module  # normalises o(x) + residual
    ln_ffn: nn.Module  # normalises down(x) + residual


def encoder_layers(model: nn.Module) -> list[Layer]:
    """The layers of a BERT-style post-LayerNorm encoder, bottom up; anything else is refused."""
    sites = [s for s in find_sites(model) if s.kind == "encoder"]
    ffns = {f.layer: f for f in find_ffns(model)}
    paths = {id(m): n for n, m in model.named_modules()}
    if not sites or len(sites) != len(ffns) or {s.layer for s in sites} != set(ffns):
        raise UnsupportedModelError(f"{type(model).__name__}: Kwon et al.'s method needs one self-attention site "
                                    f"and one FFN per encoder layer; found {len(sites)} sites, {len(ffns)} FFNs")
    out = []
    for s in sorted(sites, key=lambda s: s.layer):
        f = ffns[s.layer]
        norms = []
        for proj in (s.o, f.down):
            parent = model.get_submodule(paths[id(proj)].rpartition(".")[0])
            ln = getattr(parent, "LayerNorm", None)
            if not isinstance(ln, nn.LayerNorm) or not isinstance(proj, nn.Linear):
                raise UnsupportedModelError(f"layer {s.layer}: {paths[id(proj)]} is not followed by a post-LayerNorm "
                                            "(BERT-style ``dense`` + ``LayerNorm`` block); Kwon et al.'s tuning "
                                            "fits that block's input")
            norms.append(ln)
        if s.num_heads != s.num_kv_heads:
            raise UnsupportedModelError(f"site {s.name}: grouped key/value heads; Kwon et al. prune BERT-style heads")
        out.append(Layer(s.layer, s, f, *norms))
    return out


# ------------------------------------------------------------------ masks as hooks on the model's modules

@contextmanager
def masked(layers: list[Layer], heads: Mapping[int, torch.Tensor], neurons: Mapping[int, torch.Tensor]):
    """Multiply each head's slice of the output projection's input by ``heads[layer]`` ([H], or [B, H] per
    example) and each neuron's input of the down projection by ``neurons[layer]`` ([W] or [B, W])."""
    handles = []
    try:
        for layer in layers:
            if layer.index in heads:
                handles.append(layer.site.o.register_forward_pre_hook(_scale(heads[layer.index], layer.site.head_dim)))
            if layer.index in neurons:
                handles.append(layer.ffn.down.register_forward_pre_hook(_scale(neurons[layer.index], 1)))
        yield
    finally:
        for h in handles:
            h.remove()


def _scale(mask: torch.Tensor, width: int):
    """A pre-hook multiplying the ``width``-wide slices of the input [B, T, units * width] by ``mask`` ([units]
    or [B, units])."""
    def hook(_m, args):
        m = mask.repeat_interleave(width, dim=-1) if width > 1 else mask
        return (args[0] * (m[:, None, :] if m.dim() == 2 else m).to(args[0].dtype),)
    return hook


def _inputs(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


# ------------------------------------------------------------------ 1. Fisher

@dataclass
class Gradients:
    """Per-example gradients of the loss w.r.t. the masks, at the all-ones mask."""

    heads: dict[int, torch.Tensor]  # {layer: [N, H]} float64
    neurons: dict[int, torch.Tensor]  # {layer: [N, W]} float64

    def fisher(self) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Diagonal Fisher ``sum_x g(x)^2``: ({layer: [H]}, {layer: [W]})."""
        return ({k: g.pow(2).sum(0) for k, g in self.heads.items()}, {k: g.pow(2).sum(0) for k, g in self.neurons.items()})


def mask_gradients(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]],
                   layers: list[Layer] | None = None) -> Gradients:
    """Per-example mask gradients of the model's own loss (``batch["labels"]``): each example's mask row is a
    separate variable and the per-example losses are summed (``.loss`` is the batch mean, times the batch),
    so one backward per batch gives every example's gradient. Parameters get no gradients."""
    layers = layers or encoder_layers(model)
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    model.eval()
    heads: dict[int, list] = {layer.index: [] for layer in layers}
    neurons: dict[int, list] = {layer.index: [] for layer in layers}
    try:
        for p, _ in frozen:
            p.requires_grad_(False)
        for batch in batches:
            if "labels" not in batch:
                raise ConfigError("calibration batches need labels: the Fisher is of the model's own task loss")
            b = batch["input_ids"].shape[0]
            dev = batch["input_ids"].device
            hm = {lay.index: torch.ones(b, lay.site.num_heads, device=dev, requires_grad=True) for lay in layers}
            nm = {lay.index: torch.ones(b, lay.ffn.width, device=dev, requires_grad=True) for lay in layers}
            with masked(layers, hm, nm):
                loss = model(**_inputs(batch), labels=batch["labels"]).loss * b  # sum of per-example losses
            loss.backward()
            for lay in layers:
                heads[lay.index].append(hm[lay.index].grad.detach().double().cpu())
                neurons[lay.index].append(nm[lay.index].grad.detach().double().cpu())
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
        model.train(was_training)
    return Gradients({k: torch.cat(v) for k, v in heads.items()}, {k: torch.cat(v) for k, v in neurons.items()})


# ------------------------------------------------------------------ 2. search

@dataclass
class Prices:
    """FLOPs per example of each head ({layer: [H]}) and neuron ({layer: [W]}), and their total (the pool)."""

    heads: dict[int, torch.Tensor]
    neurons: dict[int, torch.Tensor]

    @property
    def total(self) -> float:
        return float(sum(v.sum() for v in (*self.heads.values(), *self.neurons.values())))

    def kept(self, heads: Mapping[int, torch.Tensor], neurons: Mapping[int, torch.Tensor]) -> float:
        """FLOPs of the units whose mask is non-zero."""
        return float(sum(self.heads[k][heads[k] != 0].sum() for k in heads)
                     + sum(self.neurons[k][neurons[k] != 0].sum() for k in neurons))


def prices(model: nn.Module, layers: list[Layer], seq_len: int = 128) -> Prices:
    """Headprune's FLOP prices (:func:`headprune.core.model.unit_cost.unit_costs`, ``price="flops"``) by layer."""
    c = unit_costs(model, "flops", seq_len=seq_len)
    return Prices({lay.index: c.heads[lay.site.name] for lay in layers},
                  {lay.index: c.neurons[lay.ffn.name] for lay in layers})


def search(fisher_heads: Mapping[int, torch.Tensor], fisher_neurons: Mapping[int, torch.Tensor], cost: Prices,
           share: float) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], dict]:
    """Algorithm 1: 0/1 masks ({layer: [H]}, {layer: [W]}) keeping at most ``share`` of the pool's FLOPs with
    the largest kept Fisher, and what was searched."""
    if not 0 < share < 1:
        raise ConfigError(f"share={share!r}; allowed: the share of the heads' and neurons' FLOPs kept, in (0, 1)")
    budget = share * cost.total
    keys = sorted(fisher_heads)
    hf = torch.cat([fisher_heads[k] for k in keys]).double()
    hp = torch.cat([cost.heads[k] for k in keys]).double()
    nf = torch.cat([fisher_neurons[k] for k in keys]).double()
    npr = torch.cat([cost.neurons[k] for k in keys]).double()
    h_order = torch.argsort(hf, descending=True, stable=True)
    n_order = torch.argsort(nf, descending=True, stable=True)
    h_cum_f, h_cum_p = hf[h_order].cumsum(0), hp[h_order].cumsum(0)
    n_cum_f, n_cum_p = nf[n_order].cumsum(0), npr[n_order].cumsum(0)
    best, best_h, best_n = -math.inf, 0, 0
    for h in range(1, hf.numel() + 1):
        left = budget - float(h_cum_p[h - 1])
        if left < 0:
            break
        n = int(torch.searchsorted(n_cum_p, torch.tensor([left], dtype=torch.float64), right=True)[0])
        kept = float(h_cum_f[h - 1]) + (float(n_cum_f[n - 1]) if n else 0.0)
        if kept > best:
            best, best_h, best_n = kept, h, n
    if best_h == 0:
        raise ConfigError(f"share={share}: not even the cheapest head fits the budget")
    flat_h = torch.zeros_like(hf)
    flat_h[h_order[:best_h]] = 1
    flat_n = torch.zeros_like(nf)
    flat_n[n_order[:best_n]] = 1
    return _split(flat_h, fisher_heads, keys), _split(flat_n, fisher_neurons, keys), {
        "heads_kept": best_h, "neurons_kept": best_n, "kept_fisher": best, "budget_flops": budget}


def _split(flat: torch.Tensor, like: Mapping[int, torch.Tensor], keys: list[int]) -> dict[int, torch.Tensor]:
    out, i = {}, 0
    for k in keys:
        n = like[k].numel()
        out[k] = flat[i:i + n].clone()
        i += n
    return out


# ------------------------------------------------------------------ 3. rearrangement

def rearrange(mask: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """Greedy rearrangement of one layer's 0/1 ``mask`` [n] with per-example gradients ``grads`` [N, n]: the same
    number pruned, chosen to shrink ``sum_x (sum_{i pruned} g_i(x))^2``."""
    n_kept = int((mask != 0).sum())
    n_pruned = mask.numel() - n_kept
    if n_kept == 0 or n_pruned == 0:
        return mask.clone()
    g = grads.t().double()  # [n, N]
    order = torch.argsort(g.pow(2).sum(1), stable=True).tolist()  # smallest diagonal first
    pruned = order[:n_pruned]
    for i in order[n_pruned:]:
        pruned.append(i)
        vectors = g[pruned]  # [|S|+1, N]
        rest = vectors.sum(0) - vectors  # the sum without each member
        del pruned[int(rest.pow(2).sum(1).argmin())]
    out = torch.ones_like(mask)
    out[pruned] = 0
    return out


# ------------------------------------------------------------------ 4. tuning

class _Stop(Exception):
    pass


def _capture(model, layer: Layer, batches, heads, neurons, layers, *, what: tuple[str, ...]) -> dict[str, list]:
    """Run ``batches`` with the masks up to the end of ``layer``'s FFN block; per batch the inputs of its
    (masked) output projection (``o``), attention LayerNorm (``ln1``), (masked) down projection (``down``) and
    FFN LayerNorm (``ln2``), each [B, T, C]."""
    got: dict[str, list] = {k: [] for k in what}
    mods = {"o": layer.site.o, "ln1": layer.ln_attention, "down": layer.ffn.down, "ln2": layer.ln_ffn}

    def keep(name):
        def hook(_m, args):
            got[name].append(args[0].detach().double())
            if name == what[-1]:
                raise _Stop
        return hook

    with torch.no_grad(), masked(layers, heads, neurons):  # masks first: the captures see masked inputs
        handles = [mods[k].register_forward_pre_hook(keep(k)) for k in what]
        try:
            for batch in batches:
                try:
                    model(**_inputs(batch))
                except _Stop:
                    pass
        finally:
            for h in handles:
                h.remove()
    return got


def _rows(x: torch.Tensor, batch, first_only: bool) -> torch.Tensor:
    """[tokens, C]: the non-padding tokens of ``x`` [B, T, C] (or its first token per example)."""
    if first_only:
        return x[:, 0]
    keep = batch["attention_mask"].to(x.device).bool() if "attention_mask" in batch else \
        torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    return x[keep]


def solve(ata: np.ndarray, atb: np.ndarray, damp: float = 1.0, tol: float = TOL) -> tuple[np.ndarray, bool]:
    """The code's solver: ``x = 1 + d``, ``d`` LSMR's solution of ``min ||A^T A d - (A^T b - A^T A 1)||^2 +
    damp^2 ||d||^2`` (one unknown: ``d = rhs / A^T A``, undamped, as the code); converged when ``istop < 3``."""
    rhs = atb - ata.sum(1)
    if rhs.shape[0] == 1:
        return rhs / ata[0, 0] + 1, True
    out = lsmr(ata, rhs, damp=damp, atol=tol, btol=tol, maxiter=max(100, 10 * rhs.shape[0]))
    return out[0] + 1, bool(out[1] < 3)


def attention_system(layer: Layer, teacher: list, student: dict, batches, kept: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Normal equations of the attention block of ``layer``: columns ``W_o^h x_h`` of the kept heads ``kept``
    (flattened over tokens and outputs) and a constant column; target the teacher's LayerNorm input minus the
    student's residual and output bias."""
    s = layer.site
    hd = s.head_dim
    w = s.o.weight.detach().double()  # [d, H * hd]
    k = len(kept)
    ata, atb = np.zeros((k + 1, k + 1)), np.zeros(k + 1)
    for t, x, ln, batch in zip(teacher, student["o"], student["ln1"], batches, strict=True):
        x, ln, t = (_rows(v, batch, False) for v in (x, ln, t))  # [n, H*hd], [n, d], [n, d]
        rest = ln - x @ w.t()  # residual + bias of the student
        target = (t - rest).flatten()  # [n * d]
        cols = [(x[:, h * hd:(h + 1) * hd] @ w[:, h * hd:(h + 1) * hd].t()).flatten() for h in kept]
        a = torch.stack([*cols, torch.ones_like(target)], 1)  # [n * d, k + 1]
        ata += (a.t() @ a).cpu().numpy()
        atb += (a.t() @ target).cpu().numpy()
    return ata, atb


def ffn_system(layer: Layer, teacher: list, student: dict, batches, kept: list[int], first_only: bool):
    """Normal equations of the FFN block: columns ``W_2[:, j] y_j`` of the kept neurons (no constant column);
    target the teacher's LayerNorm input minus the student's residual and output bias."""
    w = layer.ffn.down.weight.detach().double()  # [d, W]
    wk = w[:, kept]  # [d, k]
    ata, atb = np.zeros((len(kept), len(kept))), np.zeros(len(kept))
    gram = wk.t() @ wk  # [k, k]
    for t, y, ln, batch in zip(teacher, student["down"], student["ln2"], batches, strict=True):
        y, ln, t = (_rows(v, batch, first_only) for v in (y, ln, t))
        target = t - (ln - y @ w.t())  # [n, d]
        yk = y[:, kept]  # [n, k]
        ata += (gram * (yk.t() @ yk)).cpu().numpy()
        atb += (yk * (target @ wk)).sum(0).cpu().numpy()
    return ata, atb


def tune(model: nn.Module, batches: list, layers: list[Layer], teacher: tuple[dict, dict], student: tuple[dict, dict],
         *, first_token_last_ffn: bool = True, damp: float = 1.0) -> tuple[dict, dict, list[dict]]:
    """Mask tuning, layer by layer: (tuned head masks, tuned neuron masks, one record per system solved).
    ``teacher``/``student``: ({layer: [H]}, {layer: [W]}) mask values."""
    th, tn = teacher
    heads = {k: v.clone().double() for k, v in student[0].items()}
    neurons = {k: v.clone().double() for k, v in student[1].items()}
    log: list[dict] = []
    last = layers[-1].index
    for layer in layers:
        i = layer.index
        t = _capture(model, layer, batches, th, tn, layers, what=("ln1", "ln2"))
        kept = torch.nonzero(heads[i]).flatten().tolist()
        if kept and i != layers[0].index:
            s = _capture(model, layer, batches, heads, neurons, layers, what=("o", "ln1"))
            ata, atb = attention_system(layer, t["ln1"], s, batches, kept)
            x, ok = solve(ata, atb, damp)
            x = x[:-1]
            entry = {"layer": i, "block": "attention", "units": len(kept), "converged": ok,
                     "min": float(x.min()), "max": float(x.max())}
            log.append(entry)
            if not ok or np.abs(x).max() > MAX_SCALE:
                entry["stopped"] = True
                break
            heads[i][kept] *= torch.from_numpy(x)
        kept = torch.nonzero(neurons[i]).flatten().tolist()
        if kept:
            first = first_token_last_ffn and i == last
            s = _capture(model, layer, batches, heads, neurons, layers, what=("down", "ln2"))
            ata, atb = ffn_system(layer, t["ln2"], s, batches, kept, first)
            x, ok = solve(ata, atb, damp)
            entry = {"layer": i, "block": "ffn", "units": len(kept), "converged": ok, "first_token_only": first,
                     "min": float(x.min()), "max": float(x.max())}
            log.append(entry)
            if not ok or np.abs(x).max() > MAX_SCALE:
                entry["stopped"] = True
                break
            neurons[i][kept] *= torch.from_numpy(x)
    return heads, neurons, log


def reconstruction_error(model, batches, layers, teacher, student) -> dict[int, dict[str, float]]:
    """{layer: {"attention", "ffn": sum over tokens of ||student LayerNorm input - teacher's||^2}}, each block's
    student run with the student masks below it (what tuning minimises, layer by layer)."""
    out = {}
    for layer in layers:
        t = _capture(model, layer, batches, *teacher, layers, what=("ln1", "ln2"))
        s = _capture(model, layer, batches, *student, layers, what=("ln1", "ln2"))
        out[layer.index] = {k: float(sum((_rows(a, b, False) - _rows(c, b, False)).pow(2).sum()
                                         for a, c, b in zip(t[key], s[key], batches, strict=True)))
                            for k, key in (("attention", "ln1"), ("ffn", "ln2"))}
    return out


# ------------------------------------------------------------------ the pipeline

@dataclass
class KwonResult:
    model: nn.Module
    info: dict = field(default_factory=dict)


def fold(model: nn.Module, layers: list[Layer], heads: Mapping[int, torch.Tensor], neurons: Mapping[int, torch.Tensor]) -> None:
    """Multiply the output projection's columns of every head and the down projection's column of every neuron
    by its mask value (in place): the model then computes what the masked model computed."""
    with torch.no_grad():
        for layer in layers:
            hd = layer.site.head_dim
            w = layer.site.o.weight
            w.mul_(heads[layer.index].repeat_interleave(hd).to(w.dtype)[None, :])
            d = layer.ffn.down.weight
            d.mul_(neurons[layer.index].to(d.dtype)[None, :])


def kwon_prune(model: nn.Module, batches: list, share: float, *, seq_len: int = 128, rearranged: bool = True,
               tuned: bool = True, teacher_share: float | None = None, damp: float = 1.0,
               first_token_last_ffn: bool = True) -> KwonResult:
    """Kwon et al.'s pipeline on a copy of ``model``, keeping ``share`` of the heads' and neurons' FLOPs at
    ``seq_len`` (headprune's ``price="flops"`` pool). ``batches``: labelled calibration inputs."""
    start = time.perf_counter()
    layers = encoder_layers(model)
    cost = prices(model, layers, seq_len)
    grads = mask_gradients(model, batches, layers)
    fh, fn = grads.fisher()
    t_search = time.perf_counter()
    heads, neurons, found = search(fh, fn, cost, share)
    info: dict = {"share": share, "seq_len": seq_len, "pool_flops": cost.total, "search": found,
                  "calibration_examples": sum(int(b["input_ids"].shape[0]) for b in batches),
                  "seconds": {"fisher": t_search - start}}
    if rearranged:
        moved = 0
        for k in heads:
            new_h, new_n = rearrange(heads[k], grads.heads[k]), rearrange(neurons[k], grads.neurons[k])
            moved += int((new_h != heads[k]).sum() + (new_n != neurons[k]).sum()) // 2
            heads[k], neurons[k] = new_h, new_n
        info["rearranged_swaps"] = moved
    info["seconds"]["search_rearrange"] = time.perf_counter() - t_search
    info["kept_flops_planned"] = cost.kept(heads, neurons)
    if tuned:
        t_tune = time.perf_counter()
        teacher_share = math.sqrt(share) if teacher_share is None else teacher_share
        if teacher_share >= 1:
            teacher = ({k: torch.ones_like(v) for k, v in heads.items()}, {k: torch.ones_like(v) for k, v in neurons.items()})
        else:
            teacher = search(fh, fn, cost, teacher_share)[:2]
        heads, neurons, log = tune(model, batches, layers, teacher, (heads, neurons),
                                   first_token_last_ffn=first_token_last_ffn, damp=damp)
        info |= {"teacher_share": teacher_share, "tuning": log, "damp": damp}
        info["seconds"]["tune"] = time.perf_counter() - t_tune
    pruned = copy.deepcopy(model)
    fold(pruned, encoder_layers(pruned), heads, neurons)
    by_layer = {lay.index: lay for lay in layers}
    cut(pruned, {by_layer[k].site.name: torch.nonzero(v == 0).flatten().tolist() for k, v in heads.items()},
        {by_layer[k].ffn.name: torch.nonzero(v == 0).flatten().tolist() for k, v in neurons.items()})
    pruned.eval()
    info |= {"heads_kept": int(sum((v != 0).sum() for v in heads.values())),
             "neurons_kept": int(sum((v != 0).sum() for v in neurons.values())),
             "heads_per_layer": [int((heads[k] != 0).sum()) for k in sorted(heads)],
             "neurons_per_layer": [int((neurons[k] != 0).sum()) for k in sorted(neurons)]}
    info["seconds"]["total"] = time.perf_counter() - start
    return KwonResult(pruned, info)
