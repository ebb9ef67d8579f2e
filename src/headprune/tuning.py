"""Mask tuning (Kwon et al. 2022, 4.3): scale the surviving heads so each site reproduces its unpruned output.

With the dropped heads fixed, a site's output projection computes ``y = sum_h s_h W_o^h z_h + b``
(``z_h`` the head's output, ``s_h`` its mask value). Per site, in forward order, we choose the kept
heads' ``s`` that make ``y`` closest (least squares over the calibration tokens, padding left out)
to the *unpruned* model's output of that projection on the same examples. The pruned model's own
head outputs are used, with every earlier site already pruned and tuned, so a site also corrects
the drift its predecessors left. Damped (ridge) towards the unit scales:

    minimise  ||sum_h s_h c_h - (y_unpruned - b)||^2 + lam ||s - 1||^2,   lam = damping * mean_h ||c_h||^2

(``c_h = W_o^h z_h`` over all tokens), solved exactly from the [k, k] Gram matrix in float64. A
solution that is not finite or leaves ``[-max_scale, max_scale]`` is refused and the site keeps unit
scales (Kwon et al. stop tuning there; we only skip that site).

:func:`fold_scales` multiplies each head's input columns of the output projection (rows of GPT-2's
Conv1D) by its scale, so the saved model has plain weights: folding equals applying the scales as
a head mask, and pruning afterwards removes the zero-scaled heads.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from .errors import ConfigError, MaskError
from .masking import HeadMask, masked, validate_mask
from .sites import Site, find_sites, is_conv1d

ROWS_PER_CHUNK = 2048  # tokens per piece of the [tokens, heads, d_model] head contributions


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
        m = torch.ones(s.num_heads) if scales is None or s.name not in scales else \
            torch.as_tensor(scales[s.name], dtype=torch.float32).clone()
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
    cache_mb: float = 1024,
    progress: bool = False,
) -> TuneResult:
    """Tuned scales of the kept heads of every site (see the module doc); ``model`` is not changed.

    ``batches``: calibration inputs (labels are used only to find decoder tokens of encoder-decoders);
    iterated once per site, so a list. ``drop``: {site: heads dropped}. Cost: one forward of the
    unpruned model, whose output-projection outputs are kept in memory (real tokens only) while they
    fit in ``cache_mb`` (else recomputed per site), plus per site a forward cut short at that site.
    """
    if not isinstance(damping, (int, float)) or isinstance(damping, bool) or not 0 <= damping < float("inf"):
        raise ConfigError(f"damping={damping!r}; allowed: a finite number >= 0")
    if not isinstance(max_scale, (int, float)) or isinstance(max_scale, bool) or not max_scale > 0:
        raise ConfigError(f"max_scale={max_scale!r}; allowed: a number > 0")
    batches = list(batches)
    if not batches:
        raise ConfigError("batches: empty; mask tuning needs calibration examples")
    sites = find_sites(model)
    mask = scale_mask(sites, drop)  # the student: dropped heads off, the others tuned as we go
    report = []
    was_training = model.training
    model.eval()
    try:
        targets = _all_targets(model, batches, sites, cache_mb * 2**20)
        for site in tqdm(sites, desc="tune", unit="site", disable=not progress):
            kept = [h for h in range(site.num_heads) if mask[site.name][h] != 0]
            if not kept:
                continue
            cached = None if targets is None else [t[site.name] for t in targets]
            gram, rhs, norm = _normal_equations(model, batches, site, kept, mask, cached)
            scales, row = _solve(gram, rhs, norm, damping, max_scale)
            mask[site.name][kept] = scales.float()
            report.append({"site": site.name, "kept": len(kept), **row})
    finally:
        model.train(was_training)
    return TuneResult(scales=mask, sites=report)


def _solve(gram: torch.Tensor, rhs: torch.Tensor, norm: float, damping: float, max_scale: float):
    k = gram.shape[0]
    ones = torch.ones(k, dtype=torch.float64)
    lam = damping * float(gram.diagonal().mean()) if k else 0.0
    try:
        s = torch.linalg.solve(gram + lam * torch.eye(k, dtype=torch.float64), rhs + lam * ones)
        ok = bool(torch.isfinite(s).all()) and float(s.abs().max()) <= max_scale
    except RuntimeError:  # singular without damping
        s, ok = ones, False
    if not ok:
        s = ones

    def error(x):
        return float(x @ gram @ x - 2 * x @ rhs + norm)

    return s, {"error_unit": error(ones), "error_tuned": error(s), "target": norm, "fallback": not ok,
               "min_scale": float(s.min()), "max_scale": float(s.max())}


def _all_targets(model, batches, sites: list[Site], budget: float) -> list[dict[str, torch.Tensor]] | None:
    """Per batch, every site's unpruned output-projection output at real tokens ([N, d]), from one
    forward cut short after the last site; None when they would take more than ``budget`` bytes."""
    out, size = [], 0
    for batch in batches:
        store: dict[str, torch.Tensor] = {}
        handles = [s.o.register_forward_hook(functools.partial(_grab, store, len(sites), s.name)) for s in sites]
        try:
            with torch.no_grad():
                model(**_inputs(model, batch))
        except _Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        rows = {}
        for s in sites:
            if s.name not in store:
                raise ConfigError(f"site {s.name}: a calibration batch does not run it (keys: {list(batch)}); "
                                  "allowed: batches with everything the model needs (labels for encoder-decoders)")
            y = store[s.name]
            keep = _token_rows(model, batch, s, y.shape)
            y = y.reshape(-1, y.shape[-1])
            rows[s.name] = (y if keep is None else y[keep]).clone()
            size += rows[s.name].numel() * rows[s.name].element_size()
        if size > budget:
            return None
        out.append(rows)
    return out


def _grab(store: dict, total: int, name: str, _module, _args, y: torch.Tensor) -> None:
    store[name] = y.detach()
    if len(store) == total:  # the last site: the rest of the forward is not needed
        raise _Stop


def _normal_equations(model, batches, site: Site, kept: list[int], mask: HeadMask,
                      targets: list[torch.Tensor] | None = None):
    """Gram matrix [k, k], right-hand side [k] and ||target||^2 of one site's least squares
    (``targets``: the unpruned outputs at real tokens per batch, else computed here)."""
    k, hd = len(kept), site.head_dim
    weight = _head_weights(site, kept)  # [k, hd, d_out]
    bias = getattr(site.o, "bias", None)
    gram = torch.zeros(k, k, dtype=torch.float64)
    rhs = torch.zeros(k, dtype=torch.float64)
    norm = 0.0
    student = {n: m for n, m in mask.items() if n != site.name}  # this site's raw head outputs are read
    index = torch.tensor(kept)
    for i, batch in enumerate(batches):
        z = _capture(model, batch, site.o, output=False, mask=student)  # pruned model's o input [B, T, H*hd]
        rows = _token_rows(model, batch, site, z.shape)
        z = z.reshape(-1, site.num_heads, hd).index_select(1, index).double()  # [N, k, hd]
        z = z if rows is None else z[rows]
        if targets is None:
            y = _capture(model, batch, site.o, output=True, mask=None)  # unpruned o output [B, T, d]
            y = y.reshape(-1, y.shape[-1])
            y = y if rows is None else y[rows]
        else:
            y = targets[i]
        if y.shape[0] != z.shape[0]:
            raise ConfigError(f"site {site.name}: {y.shape[0]} output rows do not match {z.shape[0]} input rows")
        y = y.double()  # [N, d]
        if bias is not None:
            y = y - bias.detach().double()
        for start in range(0, z.shape[0], ROWS_PER_CHUNK):
            piece = slice(start, start + ROWS_PER_CHUNK)
            c = torch.einsum("njc,jcd->njd", z[piece], weight)  # [n, k, d] head contributions
            gram += torch.einsum("njd,nid->ji", c, c)
            rhs += torch.einsum("njd,nd->j", c, y[piece])
        norm += float((y * y).sum())
    return gram, rhs, norm


def _head_weights(site: Site, kept: list[int]) -> torch.Tensor:
    """The output projection's weights of the kept heads as [k, head_dim, d_out], float64."""
    w = site.o.weight.detach().double()
    idx = torch.tensor(kept)
    if is_conv1d(site.o):  # [in, out]
        return w.view(site.num_heads, site.head_dim, -1).index_select(0, idx)
    return w.view(w.shape[0], site.num_heads, site.head_dim).index_select(1, idx).permute(1, 2, 0)  # [out, in]


class _Stop(Exception):
    """Raised by a capture hook: the rest of the forward is not needed."""


def _capture(model: nn.Module, batch: Mapping[str, torch.Tensor], module: nn.Module, *, output: bool,
             mask: HeadMask | None) -> torch.Tensor:
    """The input (``output=False``) or output of ``module`` in one forward of ``batch``, cut short there."""
    store = {}

    def grab(_module, args, out=None):
        store["x"] = (out if output else args[0]).detach()
        raise _Stop

    handle = module.register_forward_hook(grab) if output else module.register_forward_pre_hook(grab)
    try:
        with torch.no_grad(), (masked(model, mask) if mask else nullcontext()):
            model(**_inputs(model, batch))
    except _Stop:
        pass
    finally:
        handle.remove()
    if "x" not in store:
        raise ConfigError(f"the forward never reached {type(module).__name__}; the batch does not run that site")
    return store["x"]


def _inputs(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> dict:
    inputs = dict(batch)
    if not getattr(model.config, "is_encoder_decoder", False):
        inputs.pop("labels", None)  # the loss is not needed
    if "use_cache" in inspect.signature(model.forward).parameters:
        inputs["use_cache"] = False
    return inputs


def _token_rows(model, batch: Mapping[str, torch.Tensor], site: Site, shape: torch.Size) -> torch.Tensor | None:
    """Which of the B*T rows are real tokens (bool [B*T]), or None when all count / it cannot be told."""
    if len(shape) != 3:
        return None
    bt = tuple(shape[:2])
    if getattr(model.config, "is_encoder_decoder", False) and site.kind != "encoder":
        labels, dmask = batch.get("labels"), batch.get("decoder_attention_mask")
        if labels is not None and tuple(labels.shape) == bt:
            return (labels != -100).flatten()
        return dmask.bool().flatten() if dmask is not None and tuple(dmask.shape) == bt else None
    amask = batch.get("attention_mask")
    return amask.bool().flatten() if amask is not None and tuple(amask.shape) == bt else None


def fold_scales(model: nn.Module, scales: Mapping[str, torch.Tensor]) -> None:
    """Multiply each head's input slice of its site's output projection by ``scales`` ({site: [H]}), in place.

    The model then computes what it computed masked by ``scales`` (biases are not scaled, as masking
    leaves them). Zero-scaled heads still cost compute until :func:`headprune.prune_heads` removes them.
    """
    sites = find_sites(model)
    checked = validate_mask(sites, scales)
    by_name = {s.name: s for s in sites}
    for name, s in checked.items():
        if s.dim() != 1:
            raise MaskError(f"scales[{name!r}] has shape {tuple(s.shape)}; allowed: ({by_name[name].num_heads},)")
        site = by_name[name]
        w = site.o.weight
        with torch.no_grad():
            s = s.to(device=w.device, dtype=w.dtype)
            if is_conv1d(site.o):  # [in, out]: the head's rows
                w.copy_((w.view(site.num_heads, site.head_dim, -1) * s[:, None, None]).view_as(w))
            else:  # [out, in]: the head's columns
                w.copy_((w.view(w.shape[0], site.num_heads, site.head_dim) * s[None, :, None]).view_as(w))
