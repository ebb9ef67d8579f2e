"""Mask tuning (Kwon et al. 2022, 4.3): scale the surviving heads so each site reproduces the unpruned model.

With the dropped heads fixed, a site's output projection computes ``y = sum_h s_h c_h + b``
(``c_h = W_o^h z_h`` the head's contribution, ``s_h`` its mask value), and the model adds ``y`` to
its residual stream ``r``. Per site, in forward order, we choose the kept heads' ``s`` by least
squares over the calibration tokens (padding left out), with the pruned model's own inputs (every
earlier site already pruned and tuned), against one of two targets (``target``):

- ``"residual"`` (default, Kwon et al.'s layer-wise reconstruction): the unpruned model's residual
  stream after the site, ``r_unpruned + y_unpruned``, read as the input of the first normalisation
  layer run after the projection (post-LN: the sublayer's LayerNorm; pre-LN: the next sublayer's).
  The site then also makes up for the drift ``r_unpruned - r_pruned`` its predecessors left:
  ``minimise ||sum_h s_h c_h - (r_unpruned + y_unpruned - r_pruned - b)||^2``. That the layer's
  input is ``r + y`` with ``r`` not depending on ``y`` is checked (Gemma 2 normalises ``y`` before
  the add: there ``r = 0`` and the target is the output); sites that fail the check use ``"output"``.
- ``"output"``: the projection's unpruned output, ``minimise ||sum_h s_h c_h - (y_unpruned - b)||^2``.

Damped (ridge) towards the unit scales, ``+ lam ||s - 1||^2`` with ``lam = damping * mean_h ||c_h||^2``,
solved exactly from the [k, k] Gram matrix in float64. A solution that is not finite or leaves
``[-max_scale, max_scale]`` is refused and the site keeps unit scales (Kwon et al. stop tuning
there; we only skip that site).

:func:`headprune.core.masks.folding.fold_scales` then puts the scales into the output projections, so the
saved model has plain weights.

Limit (``benchmarks/tuning_diagnosis.py``): on the 6-layer MiniLM SST-2 classifier one scale per kept
head removes about 1% of a site's reconstruction error whatever the target or damping, too little to
move the loss; the least-squares refit of whole projections (:mod:`.reconstruct`) removes about half.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from ..core.masks.masking import HeadMask, masked, validate_mask
from ..core.model.chunked import forward_few_logits
from ..core.model.devices import accumulator_device, input_device, module_device, to_device
from ..core.model.inputs import model_inputs, real_rows
from ..core.model.sites import Site, find_sites, is_conv1d
from ..distributed import reduce_sums, shard
from ..errors import ConfigError
from ..progress import progress_bar

ROWS_PER_CHUNK = 2048  # tokens per piece of the [tokens, heads, d_model] head contributions
TARGETS = ("residual", "output")


@dataclass
class TuneResult:
    """``scales``: {site: [H]} mask values (0 at dropped heads); ``sites``: per site the reconstruction
    error (summed squared error over calibration tokens) at unit and at tuned scales, and whether
    the solution was refused (``fallback``)."""

    scales: dict[str, torch.Tensor]
    sites: list[dict] = field(default_factory=list)


def scale_mask(model_or_sites: nn.Module | list[Site], drop: Mapping[str, Iterable[int]],
               scales: Mapping[str, torch.Tensor] | None = None) -> HeadMask:
    """[H] mask per site: 0 at dropped heads, the tuned scale (or 1) at kept heads."""
    sites = model_or_sites if isinstance(model_or_sites, list) else find_sites(model_or_sites)
    mask = {}
    for s in sites:
        device = module_device(s.o)
        m = torch.ones(s.num_heads, device=device) if scales is None or s.name not in scales else \
            torch.as_tensor(scales[s.name], dtype=torch.float32).to(device).clone()
        m[list(drop.get(s.name, []))] = 0.0
        mask[s.name] = m
    return validate_mask(sites, mask)


def tune_scales(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    drop: Mapping[str, Iterable[int]],
    *,
    damping: float = 1e-2,
    max_scale: float = 10.0,
    target: str = "residual",
    cache_mb: float = 1024,
    progress: bool = False,
) -> TuneResult:
    """Tuned scales of the kept heads of every site (see the module doc); ``model`` is not changed.

    ``batches``: calibration inputs (labels are used only to find decoder tokens of encoder-decoders);
    iterated once per site, so a list. ``drop``: {site: heads dropped}. ``target``: what each site
    reproduces (see the module doc). Cost: one forward of the unpruned model, whose targets are kept
    in memory (real tokens only) while they fit in ``cache_mb`` (else recomputed per site), plus per
    site a forward cut short just after that site.
    """
    if not isinstance(damping, (int, float)) or isinstance(damping, bool) or not 0 <= damping < float("inf"):
        raise ConfigError(f"damping={damping!r}; allowed: a finite number >= 0")
    if not isinstance(max_scale, (int, float)) or isinstance(max_scale, bool) or not max_scale > 0:
        raise ConfigError(f"max_scale={max_scale!r}; allowed: a number > 0")
    if target not in TARGETS:
        raise ConfigError(f"target={target!r}; allowed: {', '.join(TARGETS)}")
    batches = [to_device(b, input_device(model)) for b in batches]  # once, beside the model
    if not batches:
        raise ConfigError("batches: empty; mask tuning needs calibration examples")
    sites = find_sites(model)
    mask = scale_mask(sites, drop)  # the student: dropped heads off, the others tuned as we go
    report = []
    was_training = model.training
    model.eval()
    try:
        norms = residual_norms(model, batches[0], sites) if target == "residual" else {}
        targets = _all_targets(model, batches, sites, norms, cache_mb * 2**20)
        for site in progress_bar(sites, desc="tune", unit="site", show=progress):
            kept = [h for h in range(site.num_heads) if mask[site.name][h] != 0]
            if not kept:
                continue
            cached = None if targets is None else [t[site.name] for t in targets]
            gram, rhs, norm = _normal_equations(model, batches, site, kept, mask, norms.get(site.name), cached)
            scales, row = _solve(gram, rhs, norm, damping, max_scale)
            mask[site.name][kept] = scales.to(mask[site.name].device, torch.float32)
            report.append({"site": site.name, "kept": len(kept),
                           "target": "residual" if site.name in norms else "output", **row})
    finally:
        model.train(was_training)
    return TuneResult(scales=mask, sites=report)


def _solve(gram: torch.Tensor, rhs: torch.Tensor, norm: float, damping: float, max_scale: float):
    """Scales [k] and the report row of one site's damped least squares."""
    k = gram.shape[0]
    ones = torch.ones(k, dtype=torch.float64, device=gram.device)
    lam = damping * float(gram.diagonal().mean())
    try:
        s = torch.linalg.solve(gram + lam * torch.eye(k, dtype=torch.float64, device=gram.device), rhs + lam * ones)
        ok = bool(torch.isfinite(s).all()) and float(s.abs().max()) <= max_scale
    except RuntimeError:  # singular without damping
        s, ok = ones, False
    if not ok:
        s = ones

    def error(x):
        return float(x @ gram @ x - 2 * x @ rhs + norm)

    return s, {"error_unit": error(ones), "error_tuned": error(s), "target_norm": norm, "fallback": not ok,
               "min_scale": float(s.min()), "max_scale": float(s.max())}


def _is_norm(module: nn.Module) -> bool:
    """A leaf normalisation layer (LayerNorm, RMSNorm and the families' own)."""
    name = type(module).__name__.lower()
    return not any(True for _ in module.children()) and (isinstance(module, nn.LayerNorm) or name.endswith("norm"))


def residual_norms(model: nn.Module, batch: Mapping[str, torch.Tensor], sites: list[Site]) -> dict[str, nn.Module]:
    """{site: the first normalisation layer run after its output projection}, for the sites where that
    layer's input is the residual stream plus the projection's output (checked on ``batch``: scaling
    the output changes the layer's input by exactly that). Post-LN models (BERT, Marian): the
    sublayer's own LayerNorm; pre-LN (Llama, GPT-2, T5): the next sublayer's. Sites without one (the
    attention output normalised before the add, as Gemma 2's) are left out: they reproduce the output."""
    norms = [m for m in model.modules() if _is_norm(m)]
    armed: set[str] = set()
    found: dict[str, nn.Module] = {}

    def arm(name, *_):
        armed.add(name)

    def take(module, _args):
        for name in armed:
            found.setdefault(name, module)
        armed.clear()

    handles = [s.o.register_forward_hook(functools.partial(arm, s.name)) for s in sites]
    handles += [m.register_forward_pre_hook(take) for m in norms]
    _run_hooked(model, batch, handles)
    out = {}
    for site in sites:
        if site.name not in found:
            continue
        _, y1, u1 = record_projection(model, batch, site, found[site.name], None)
        _, y2, u2 = record_projection(model, batch, site, found[site.name], None, scale=0.5)
        if u1.shape == y1.shape and torch.allclose(u1 - y1, u2 - y2, rtol=1e-4,
                                                   atol=1e-5 * float(u1.abs().max().clamp_min(1.0))):
            out[site.name] = found[site.name]
    return out


def _all_targets(model, batches, sites: list[Site], norms: Mapping[str, nn.Module],
                 budget: float) -> list[dict[str, torch.Tensor]] | None:
    """Per batch, every site's unpruned target at real tokens ([N, d]): the residual stream after it
    (its norm's input) where ``norms`` has the site, else its output projection's output; from one
    forward cut short once all are read. None when they would take more than ``budget`` bytes."""
    out, size = [], 0
    for batch in batches:
        store = read_targets(model, batch, sites, norms)
        rows = {}
        for s in sites:
            if s.name not in store:
                raise ConfigError(f"site {s.name}: a calibration batch does not run it (keys: {list(batch)}); "
                                  "allowed: batches with everything the model needs (labels for encoder-decoders)")
            y = store[s.name]
            keep = token_rows(model, batch, s, y.shape)
            y = y.reshape(-1, y.shape[-1])
            rows[s.name] = (y if keep is None else y[keep]).clone()
            size += rows[s.name].numel() * rows[s.name].element_size()
        if size > budget:
            return None
        out.append(rows)
    return out


def read_targets(model, batch, sites: list[Site], norms: Mapping[str, nn.Module]) -> dict[str, torch.Tensor]:
    """{site: target [B, T, d]} of one unpruned forward, cut short once every site's target is read."""
    store: dict[str, torch.Tensor] = {}
    armed: set[str] = set()

    def done():
        if len(store) == len(sites):  # the rest of the forward is not needed
            raise _Stop

    def after_o(name, _module, _args, y):
        if name in norms:
            armed.add(name)
        else:
            store.setdefault(name, y.detach())
            done()

    def before_norm(module, args):
        for name in [n for n in armed if norms[n] is module]:
            store.setdefault(name, args[0].detach())
            armed.discard(name)
        done()

    handles = [s.o.register_forward_hook(functools.partial(after_o, s.name)) for s in sites]
    handles += [m.register_forward_pre_hook(before_norm) for m in {id(m): m for m in norms.values()}.values()]
    _run_hooked(model, batch, handles)
    return store


def _real(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """[B, T, d] -> [N, d]: the rows of real tokens (all when ``rows`` is None)."""
    t = t.reshape(-1, t.shape[-1])
    return t if rows is None else t[rows.to(t.device)]


def _normal_equations(model, batches, site: Site, kept: list[int], mask: HeadMask, norm_layer: nn.Module | None,
                      targets: list[torch.Tensor] | None = None):
    """Gram matrix [k, k], right-hand side [k] and ||target||^2 of one site's least squares
    (``targets``: the unpruned targets at real tokens per batch, else computed here). With
    ``norm_layer`` the target of the heads' sum is the unpruned residual stream minus the pruned
    model's own residual (and bias): the site also makes up for the drift its predecessors left."""
    k, hd = len(kept), site.head_dim
    weight = _head_weights(site, kept)  # [k, hd, d_out]
    bias = getattr(site.o, "bias", None)
    device = accumulator_device(weight.device)  # float64 sums on the site's device (the CPU for mps)
    gram = torch.zeros(k, k, dtype=torch.float64, device=device)
    rhs = torch.zeros(k, dtype=torch.float64, device=device)
    norm = torch.zeros((), dtype=torch.float64, device=device)
    student = {n: m for n, m in mask.items() if n != site.name}  # this site's raw head outputs are read
    index = torch.tensor(kept, dtype=torch.long, device=weight.device)
    for i, batch in shard(enumerate(batches)):  # under torchrun: this rank's batches, sums reduced below
        z, y_own, u_own = record_projection(model, batch, site, norm_layer, student)  # pruned model: o input [B, T, H*hd]
        rows = token_rows(model, batch, site, z.shape)
        z = _real(z, rows).view(-1, site.num_heads, hd).index_select(1, index.to(z.device)).to(device, torch.float64)  # [N, k, hd]
        if targets is None:
            _, y_t, u_t = record_projection(model, batch, site, norm_layer, None)  # the unpruned model
            y = _real(y_t if norm_layer is None else u_t, rows)
        else:
            y = targets[i]
        if y.shape[0] != z.shape[0]:
            raise ConfigError(f"site {site.name}: {y.shape[0]} output rows do not match {z.shape[0]} input rows")
        y = y.to(device, torch.float64)  # [N, d]
        if norm_layer is not None:  # minus the pruned model's residual: u = residual + o(z)
            y = y - (_real(u_own, rows) - _real(y_own, rows)).to(device, torch.float64)
        if bias is not None:
            y = y - bias.detach().to(device, torch.float64)
        for start in range(0, z.shape[0], ROWS_PER_CHUNK):
            piece = slice(start, start + ROWS_PER_CHUNK)
            c = torch.einsum("njc,jcd->njd", z[piece], weight.to(device))  # [n, k, d] head contributions
            gram += torch.einsum("njd,nid->ji", c, c)
            rhs += torch.einsum("njd,nd->j", c, y[piece])
        norm += (y * y).sum()
    sums, _ = reduce_sums({"gram": gram, "rhs": rhs, "norm": norm}, 0)  # unchanged in one process
    return sums["gram"].to(device), sums["rhs"].to(device), float(sums["norm"])


def _head_weights(site: Site, kept: list[int]) -> torch.Tensor:
    """The output projection's weights of the kept heads as [k, head_dim, d_out], float64."""
    w = site.o.weight.detach().double()
    idx = torch.tensor(kept, dtype=torch.long, device=w.device)
    if is_conv1d(site.o):  # [in, out]
        return w.view(site.num_heads, site.head_dim, -1).index_select(0, idx)
    return w.view(w.shape[0], site.num_heads, site.head_dim).index_select(1, idx).permute(1, 2, 0)  # [out, in]


def _run_hooked(model: nn.Module, batch: Mapping[str, torch.Tensor], handles: list, mask: HeadMask | None = None):
    """One forward of ``batch`` (under ``mask``) with the given hooks, which are removed afterwards;
    a hook may end it early by raising :class:`_Stop`."""
    try:
        with torch.no_grad(), (masked(model, mask) if mask else nullcontext()):
            forward_few_logits(model, model_inputs(model, batch, cache=False))  # logits unread
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()


class _Stop(Exception):
    """Raised by a capture hook: the rest of the forward is not needed."""


def record_projection(model: nn.Module, batch: Mapping[str, torch.Tensor], site: Site, norm_layer: nn.Module | None,
            mask: HeadMask | None, *, scale: float = 1.0):
    """One forward of ``batch`` cut short after ``site``: its output projection's input ``z``, output
    ``y`` and, with ``norm_layer``, that layer's input ``u`` next (else None). ``scale``: multiply the
    projection's output by it (to check that ``u`` takes it in linearly)."""
    store = {}

    def before_o(_module, args):
        store.setdefault("z", args[0].detach())

    def after_o(_module, _args, y):
        if "y" in store:
            return None
        store["y"] = (y * scale).detach()
        if norm_layer is None:
            raise _Stop
        return y * scale if scale != 1.0 else None

    def before_norm(_module, args):
        if "y" in store:
            store["u"] = args[0].detach()
            raise _Stop

    handles = [site.o.register_forward_pre_hook(before_o), site.o.register_forward_hook(after_o)]
    if norm_layer is not None:
        handles.append(norm_layer.register_forward_pre_hook(before_norm))
    _run_hooked(model, batch, handles, mask)
    if "y" not in store or (norm_layer is not None and "u" not in store):
        raise ConfigError(f"the forward never reached site {site.name}; the batch does not run that site")
    return store["z"], store["y"], store.get("u")


def token_rows(model, batch: Mapping[str, torch.Tensor], site: Site, shape: torch.Size) -> torch.Tensor | None:
    """Which of the B*T rows are real tokens (bool [B*T]), or None when all count / it cannot be told."""
    return real_rows(model, batch, site.kind, shape)
