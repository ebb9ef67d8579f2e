"""Compensation by least squares: refit each pruned layer's output projection to reproduce the unpruned layer.

After heads and neurons are removed, every attention output projection (input: the kept heads'
outputs, ``[..., k * head_dim]``) and every FFN down projection (input: the kept neurons,
``[..., k]``) is refitted in forward order -- weights *and* bias -- so that the pruned model, on its
own inputs (every earlier layer already refitted), reproduces the unpruned model on calibration
tokens (padding left out):

- ``"residual"`` (default, Kwon et al.'s layer-wise reconstruction): the unpruned residual stream
  after the layer, read as the input of the first normalisation layer that runs after the
  projection (post-LN: the sublayer's own LayerNorm; pre-LN: the next sublayer's), minus the pruned
  model's own residual; so each layer also makes up for the drift its predecessors left. Layers where
  that input is not ``residual + output`` (checked, :func:`.tuning.residual_norms`) use ``"output"``.
- ``"output"``: the unpruned projection's output.

Mask tuning (:mod:`.tuning`) fits one scale per kept head; this fits every column of the
projection (``k x d_out + d_out`` numbers), so it can also re-mix what the kept units carry. It is
ridge-damped towards the current weights (``+ lam ||W - W_0||^2``, ``lam = damping x`` the mean
squared input feature) and solved exactly in float64 from the ``[k+1, k+1]`` Gram matrix. A fit with
so many numbers can overfit the calibration tokens: :func:`headprune.compression.compress`
keeps it only if it lowers the loss on a validation split the fit never saw.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from types import SimpleNamespace

import torch
from torch import nn

from ..core.model.devices import accumulator_device, input_device, to_device
from ..core.model.ffn import find_ffns
from ..core.model.sites import find_sites, is_conv1d
from ..errors import ConfigError
from ..progress import progress_bar
from .layerwise import LayerStack, Stop, layer_stack
from .tuning import TARGETS, read_targets, record_projection, residual_norms, token_rows


def reconstruct(
    student: nn.Module,
    teacher: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    damping: float = 1e-2,
    target: str = "residual",
    cache_mb: float = 2048,
    layerwise: bool | None = None,
    progress: bool = False,
) -> list[dict]:
    """Refit, in place, the output projections of ``student`` (``teacher`` pruned) to reproduce ``teacher``.

    ``batches``: calibration inputs (a list; iterated twice per projection). Returns one row per
    projection: name, inputs kept, target kind, summed squared error before and after the fit. The
    teacher's targets come from one forward per batch and are kept in memory (real tokens only) while
    they fit in ``cache_mb``; else each projection runs the teacher again.

    ``layerwise``: run the pruned model one layer at a time from recorded layer inputs
    (:mod:`.layerwise`: ``O(L)`` layer passes instead of ``O(L^2)``), where that provably computes what
    the whole model computes (None, the default: then, else the whole model per projection; True:
    refuse otherwise; False: always the whole model). Both give the same fit. The replay holds one
    layer's hidden states for every batch: past ``cache_mb`` the whole model is run instead.
    """
    if not isinstance(damping, (int, float)) or isinstance(damping, bool) or not 0 <= damping < float("inf"):
        raise ConfigError(f"damping={damping!r}; allowed: a finite number >= 0")
    if target not in TARGETS:
        raise ConfigError(f"target={target!r}; allowed: {', '.join(TARGETS)}")
    batches = list(batches)
    if not batches:
        raise ConfigError("batches: empty; reconstruction needs calibration examples")
    pairs = _projections(student, teacher)
    s_batches = [to_device(b, input_device(student)) for b in batches]  # once, beside each model
    t_batches = [to_device(b, input_device(teacher)) for b in batches]
    was = (student.training, teacher.training)
    student.eval()
    teacher.eval()
    rows = []
    try:
        # which norm reads each projection's residual: a structural check, so one example will do
        s_norms = residual_norms(student, _one(s_batches[0]), [p[0] for p in pairs]) if target == "residual" else {}
        t_norms = residual_norms(teacher, _one(t_batches[0]), [p[1] for p in pairs]) if target == "residual" else {}
        for name in [n for n in t_norms if n not in s_norms]:  # both read the residual, or neither
            del t_norms[name]
        cached = _targets(teacher, t_batches, [t for _, t in pairs], t_norms, cache_mb * 2**20)
        norms = {s.name: s_norms.get(s.name) if t.name in t_norms else None for s, t in pairs}
        units = [(s.o, norms[s.name]) for s, _ in pairs]
        stack = None if layerwise is False else layer_stack(student, s_batches, units, budget=cache_mb * 2**20)
        if stack is None and layerwise:
            raise ConfigError(f"layerwise=True: {type(student).__name__} cannot be replayed one layer at a time "
                              "(an encoder-decoder, its layers not one stack run in order, or more than cache_mb of "
                              "hidden states); allowed: None or False")
        for s_unit, t_unit in progress_bar(pairs, desc="reconstruct", unit="layer", show=progress):
            targets = None if cached is None else [c[t_unit.name] for c in cached]
            record = None
            if stack is not None:
                while stack.index < stack.layer_of(s_unit.o):
                    stack.advance()
                norm = norms[s_unit.name]
                inside = norm is not None and stack.layer_of(norm) == stack.index
                record = functools.partial(_record_in_layer, stack, s_unit.o, norm, inside)
            rows.append(_refit(student, teacher, s_batches, t_batches, s_unit, t_unit, norms[s_unit.name],
                               t_norms.get(t_unit.name), damping, targets, record))
    finally:
        student.train(was[0])
        teacher.train(was[1])
    return rows


def _projections(student: nn.Module, teacher: nn.Module) -> list[tuple[SimpleNamespace, SimpleNamespace]]:
    """(student unit, teacher unit) per output / down projection present in both, in module order;
    a unit is a namespace with ``name``, ``kind`` and ``o`` (the projection), as :mod:`.tuning` reads."""
    t_sites = {s.name: s for s in find_sites(teacher)}
    t_ffns = {f.name: f for f in find_ffns(teacher, skip_moe=True)}
    units = []
    for s in find_sites(student):
        if s.name in t_sites:
            units.append((s.path, SimpleNamespace(name=s.name, kind=s.kind, o=s.o),
                          SimpleNamespace(name=s.name, kind=s.kind, o=t_sites[s.name].o)))
    for f in find_ffns(student, skip_moe=True):
        if f.name in t_ffns:
            kind = f.name.split(".")[0]
            units.append((f.path, SimpleNamespace(name=f.name, kind=kind, o=f.down),
                          SimpleNamespace(name=f.name, kind=kind, o=t_ffns[f.name].down)))
    order = {id(m): i for i, m in enumerate(student.modules())}
    units.sort(key=lambda u: order[id(u[1].o)])
    return [(s, t) for _, s, t in units]


def _targets(teacher, batches, units, norms, budget: float) -> list[dict[str, torch.Tensor]] | None:
    """Per batch, every unit's target of the unpruned model at real tokens ([N, d]), or None past ``budget`` bytes."""
    out, size = [], 0
    for batch in batches:
        store = read_targets(teacher, batch, units, norms)
        rows = {}
        for u in units:
            if u.name not in store:
                raise ConfigError(f"{u.name}: a calibration batch does not run it (keys: {list(batch)})")
            y = store[u.name]
            rows[u.name] = _real(y, token_rows(teacher, batch, u, y.shape)).clone()
            size += rows[u.name].numel() * rows[u.name].element_size()
        if size > budget:
            return None
        out.append(rows)
    return out


def _refit(student, teacher, batches, t_batches, s_unit, t_unit, s_norm, t_norm, damping: float,
           targets: list[torch.Tensor] | None, record=None) -> dict:
    proj = s_unit.o
    conv = is_conv1d(proj)
    device = accumulator_device(proj.weight.device)  # float64 sums beside the projection (the CPU for mps)
    w0 = proj.weight.detach().to(device, torch.float64)
    w0 = w0 if conv else w0.T  # [k, d_out]
    k, d = w0.shape
    bias = getattr(proj, "bias", None)
    cols = k + (1 if bias is not None else 0)
    gram = torch.zeros(cols, cols, dtype=torch.float64, device=device)
    rhs = torch.zeros(cols, d, dtype=torch.float64, device=device)
    norm = 0.0
    for i, batch in enumerate(batches):
        # the pruned model's own inputs: its current layer replayed, or the whole model cut short
        z, y_s, u_s = record(i) if record is not None else record_projection(student, batch, s_unit, s_norm, None)
        rows = token_rows(student, batch, s_unit, z.shape)
        x = _real(z, rows).to(device, torch.float64)  # [N, k]
        if targets is None:
            _, y_t, u_t = record_projection(teacher, t_batches[i], t_unit, t_norm, None)
            y = _real(y_t if t_norm is None else u_t, rows)  # [N, d]
        else:
            y = targets[i]
        y = y.to(device, torch.float64)
        if y.shape[0] != x.shape[0]:
            raise ConfigError(f"{s_unit.name}: {y.shape[0]} target rows do not match {x.shape[0]} input rows")
        if s_norm is not None:  # minus the pruned model's own residual: u = residual + projection(z)
            y = y - (_real(u_s, rows) - _real(y_s, rows)).to(device, torch.float64)
        if bias is not None:
            x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=torch.float64, device=device)], 1)
        gram += x.T @ x
        rhs += x.T @ y
        norm += float((y * y).sum())
    current = torch.cat([w0, bias.detach().to(device, torch.float64)[None]], 0) if bias is not None else w0  # [cols, d]
    lam = damping * float(gram.diagonal().mean())
    eye = torch.eye(cols, dtype=torch.float64, device=device)
    fallback = False
    try:
        solution = torch.linalg.solve(gram + lam * eye, rhs + lam * current)
        fallback = not bool(torch.isfinite(solution).all())
    except RuntimeError:  # singular without damping
        fallback = True
    if fallback:
        solution = current

    def error(w):
        return float((w * (gram @ w)).sum() - 2 * (w * rhs).sum() + norm)

    row = {"layer": s_unit.name, "inputs": k, "target": "output" if s_norm is None else "residual",
           "error_before": error(current), "error_after": error(solution), "target_norm": norm, "fallback": fallback}
    if not fallback:
        _write(proj, solution[:k], solution[k] if bias is not None else None, conv)
    return row


def _one(batch: Mapping[str, torch.Tensor]) -> dict:
    """The example of ``batch`` with the most real tokens, as a batch of one."""
    mask = batch.get("attention_mask")
    i = int(mask.sum(1).argmax()) if isinstance(mask, torch.Tensor) and mask.dim() == 2 else 0
    n = next(v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {k: v[i:i + 1] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n else v
            for k, v in batch.items()}


def _record_in_layer(stack: LayerStack, proj: nn.Module, norm: nn.Module | None, inside: bool, b: int):
    """(z, y, u) of ``proj`` as :func:`.tuning.record_projection` reads them, from the stack's current layer on batch
    ``b``: ``u`` is the input of ``norm`` when it runs ``inside`` the layer, else the layer's output (which
    :func:`.layerwise.layer_stack` checked is what that norm reads)."""
    store = {}

    def before_o(_module, args):
        store.setdefault("z", args[0].detach())

    def after_o(_module, _args, y):
        if "y" not in store:
            store["y"] = y.detach()
            if norm is None:
                raise Stop

    def before_norm(_module, args):
        if "y" in store and "u" not in store:
            store["u"] = args[0].detach()
            raise Stop

    hooks = [(proj, "pre", before_o), (proj, "post", after_o)] + ([(norm, "pre", before_norm)] if inside else [])
    out = stack.run(b, hooks)
    if norm is not None and not inside:
        store["u"] = out
    if "y" not in store or (norm is not None and store.get("u") is None):
        raise ConfigError(f"the layer holding {type(proj).__name__} never ran it on batch {b}")
    return store["z"], store["y"], store.get("u")


def _write(proj: nn.Module, w: torch.Tensor, b: torch.Tensor | None, conv: bool) -> None:
    with torch.no_grad():
        proj.weight.copy_((w if conv else w.T).to(proj.weight.device, proj.weight.dtype))
        if b is not None:
            proj.bias.copy_(b.to(proj.bias.device, proj.bias.dtype))


def _real(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    t = t.reshape(math.prod(t.shape[:-1]), t.shape[-1])  # [N, d]; d may be 0 (an emptied FFN)
    return t if rows is None else t[rows.to(t.device)]
