"""FFN neurons as prunable units: the reversible mask and the irreversible surgery, each tested
against the other.

A neuron mask maps FFN name -> float tensor ``[width]`` or ``[batch, width]`` (one value per example,
for exact per-example gradients). Masking registers a forward pre-hook on the FFN's down projection
that scales its input ``[batch, ..., width]`` feature by feature -- the same place and the same rule
as head masks (:mod:`.masking`), so the two compose: ``with masked(model, heads),
masked_neurons(model, neurons):`` runs with both, and nested neuron masks multiply.

Surgery (:func:`prune_neurons`) removes neurons: their rows of every up/gate projection (columns for
GPT-2's Conv1D) and their columns of the down projection (rows for Conv1D). A neuron with mask 0
contributes exactly nothing, so the pruned model computes what the masked one does. The original
indices of the kept neurons are recorded in the config (``headprune_kept_neurons``, beside the kept
heads) and replayed by :func:`headprune.load_pruned`. An FFN may lose every neuron: its down
projection then adds only its bias, as under an all-zero mask (GPT-2's Conv1D cannot run zero
features: there one neuron stays, with a zero column of the down projection).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from ..errors import MaskError, PlanError, SiteError
from .devices import module_device
from .ffn import FFN, find_ffns
from .sites import is_conv1d
from .surgery import KEPT_KEY, ORIGINAL_KEY, config_record, kept_heads, original_heads

NeuronMask = dict[str, torch.Tensor]  # ffn name -> [width] or [batch, width]
KEPT_NEURONS_KEY = "headprune_kept_neurons"  # config attribute: {ffn: original indices of the kept neurons}
ORIGINAL_NEURONS_KEY = "headprune_original_neurons"  # config attribute: {ffn: width before any pruning}

_STACK = "_headprune_neuron_stack"  # [(token, mask)], innermost last
_HANDLES = "_headprune_neuron_handles"


def neuron_ones(model_or_ffns: nn.Module | list[FFN], batch: int | None = None, *,
                requires_grad: bool = False) -> NeuronMask:
    """A mask of ones for every FFN: ``[width]`` each, or ``[batch, width]``."""
    ffns = model_or_ffns if isinstance(model_or_ffns, list) else find_ffns(model_or_ffns)
    shape = (lambda f: (f.width,)) if batch is None else (lambda f: (batch, f.width))
    return {f.name: torch.ones(shape(f), requires_grad=requires_grad, device=module_device(f.down)) for f in ffns}


def neuron_mask_from(model: nn.Module, dropped: Mapping[str, Iterable[int]]) -> NeuronMask:
    """A [width] mask with zeros at ``dropped`` ({ffn: neuron indices}) and ones elsewhere."""
    ffns = {f.name: f for f in find_ffns(model)}
    mask = neuron_ones(list(ffns.values()))
    for name, idx in dropped.items():
        _ffn(ffns, name, "neurons")
        mask[name][_indices("neurons", name, idx, ffns[name].width)] = 0.0
    return mask


def validate_neuron_mask(ffns: list[FFN], mask: Mapping[str, object]) -> NeuronMask:
    if not isinstance(mask, Mapping):
        raise MaskError(f"neuron mask must be a mapping ffn name -> tensor, got {type(mask).__name__}")
    by_name = {f.name: f for f in ffns}
    out: NeuronMask = {}
    for name, value in mask.items():
        ffn = _ffn(by_name, name, "neuron mask")
        m = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float32)
        if not m.is_floating_point():
            m = m.to(torch.float32)
        if m.dim() not in (1, 2) or m.shape[-1] != ffn.width:
            raise MaskError(f"neuron mask[{name!r}] has shape {tuple(m.shape)}; allowed: ({ffn.width},) or "
                            f"(batch, {ffn.width})")
        if not bool(torch.isfinite(m.detach()).all()):
            raise MaskError(f"neuron mask[{name!r}] has non-finite values; allowed: finite floats")
        out[name] = m
    return out


@contextmanager
def masked_neurons(model: nn.Module, mask: Mapping[str, object]) -> Iterator[nn.Module]:
    """``with masked_neurons(model, mask):`` runs ``model`` with its FFN neurons scaled by ``mask`` (times any
    neuron mask already applied); restores the masks applied before on exit."""
    ffns = find_ffns(model)
    checked = validate_neuron_mask(ffns, mask)
    token = object()
    stack = list(getattr(model, _STACK, []))
    _install(model, ffns, stack + [(token, checked)])
    try:
        yield model
    finally:
        left = [e for e in getattr(model, _STACK, []) if e[0] is not token]
        _install(model, find_ffns(model), left)


def is_neuron_masked(model: nn.Module) -> bool:
    return bool(getattr(model, _STACK, None))


def _install(model: nn.Module, ffns: list[FFN], stack: list) -> None:
    for handle in getattr(model, _HANDLES, []):
        handle.remove()
    handles = []
    for ffn in ffns:
        factors = [m[ffn.name] for _, m in stack if ffn.name in m]
        if factors:
            handles.append(ffn.down.register_forward_pre_hook(_ScaleNeurons(factors)))
    setattr(model, _HANDLES, handles)
    setattr(model, _STACK, stack)


class _ScaleNeurons:
    """Forward pre-hook: x [batch, ..., width] -> x * product of factors ([width] or [batch, width])."""

    def __init__(self, factors: list[torch.Tensor]):
        self.factors = factors

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        x = args[0]  # [batch, ..., width]
        m = self.factors[0].to(dtype=x.dtype, device=x.device)
        for factor in self.factors[1:]:
            m = m * factor.to(dtype=x.dtype, device=x.device)
        if m.dim() == 2:
            if m.shape[0] != x.shape[0]:
                raise MaskError(f"neuron mask batch {m.shape[0]} does not match the input batch {x.shape[0]}")
            m = m.view(m.shape[0], *([1] * (x.dim() - 2)), m.shape[-1])  # [B, 1.., width]
        return (x * m), *args[1:]


# ---------------------------------------------------------------- surgery

def original_neurons(model: nn.Module) -> dict[str, int]:
    """{ffn: width before any pruning}."""
    recorded = config_record_neurons(model.config, ORIGINAL_NEURONS_KEY)
    current = {f.name: f.width for f in find_ffns(model)}
    return {**current, **(recorded or {})}


def kept_neurons(model: nn.Module) -> dict[str, list[int]]:
    """{ffn: original indices of the neurons it keeps} (all of them when not pruned)."""
    kept = config_record_neurons(model.config, KEPT_NEURONS_KEY) or {}
    return {name: list(kept.get(name, range(n))) for name, n in original_neurons(model).items()}


def config_record_neurons(config, key: str) -> dict | None:
    value = getattr(config, key, None)
    return dict(value) if value else None


def prune_neurons(model: nn.Module, dropped: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
    """Remove ``dropped`` ({ffn: indices among the neurons it has now}) from ``model`` in place; returns the
    kept neurons (original indices). Validated before anything changes."""
    ffns = {f.name: f for f in find_ffns(model)}
    drops = {}
    for name, idx in dropped.items():
        _ffn(ffns, name, "dropped")
        drops[name] = set(_indices("dropped", name, idx, ffns[name].width))
    before = kept_neurons(model)
    original = original_neurons(model)
    with torch.no_grad():
        for name, drop in drops.items():
            if not drop:
                continue
            ffn = ffns[name]
            keep = [i for i in range(ffn.width) if i not in drop]
            if not keep and any(is_conv1d(m) for m in (*ffn.ups, ffn.down)):  # Conv1D cannot run 0 features:
                keep = [min(drop)]  # one neuron stays with a zero down column: it adds exactly nothing
                _zero_input(ffn.down, keep[0])
            index = torch.tensor(keep, dtype=torch.long, device=ffn.down.weight.device)
            for up in ffn.ups:
                _slice(up, index, out_side=True)
            _slice(ffn.down, index, out_side=False)
            before[name] = [before[name][i] for i in keep]
    if not config_record(model.config, KEPT_KEY):  # a pruned model is one that carries kept heads
        setattr(model.config, ORIGINAL_KEY, original_heads(model))
        setattr(model.config, KEPT_KEY, kept_heads(model))
    setattr(model.config, ORIGINAL_NEURONS_KEY, original)
    setattr(model.config, KEPT_NEURONS_KEY, before)
    return before


def keep_neurons(model: nn.Module, kept: Mapping[str, Iterable[int]],
                 original: Mapping[str, int] | None = None) -> dict[str, list[int]]:
    """Replay kept neurons ({ffn: original indices kept}) on a model whose FFNs are unpruned."""
    if config_record_neurons(model.config, KEPT_NEURONS_KEY):
        raise PlanError("keep_neurons needs a model whose neurons are unpruned; this one carries kept neurons")
    if not isinstance(kept, Mapping):
        raise PlanError(f"kept neurons must be a mapping ffn name -> indices, got {type(kept).__name__}")
    current = {f.name: f.width for f in find_ffns(model)}
    if original is not None and dict(original) != current:
        raise PlanError(f"kept neurons are for a different model: widths (recorded {dict(original)}, model {current})")
    drops = {}
    for name, keep in kept.items():
        if name not in current:
            raise PlanError(f"kept neurons: unknown ffn {name!r}; allowed: {', '.join(current)}")
        keep = set(_indices("kept neurons", name, keep, current[name], error=PlanError))
        drops[name] = [i for i in range(current[name]) if i not in keep]
    return prune_neurons(model, drops)


def _zero_input(module: nn.Module, i: int) -> None:
    if is_conv1d(module):
        module.weight[i, :] = 0.0
    else:
        module.weight[:, i] = 0.0


def _slice(module: nn.Module, index: torch.Tensor, *, out_side: bool) -> None:
    """Keep ``index`` of ``module``'s output features (``out_side``) or input features."""
    conv = is_conv1d(module)
    dim = (1 if conv else 0) if out_side else (0 if conv else 1)  # Conv1D weight [in, out]; Linear [out, in]
    module.weight = nn.Parameter(module.weight.index_select(dim, index).contiguous(),
                                 requires_grad=module.weight.requires_grad)
    if out_side and getattr(module, "bias", None) is not None:
        module.bias = nn.Parameter(module.bias.index_select(0, index).contiguous(),
                                   requires_grad=module.bias.requires_grad)
    if conv:
        module.nf = module.weight.shape[1]
    elif out_side:
        module.out_features = index.numel()
    else:
        module.in_features = index.numel()


def _indices(argument: str, name: str, idx: Iterable[int], n: int, error: type = MaskError) -> list[int]:
    if isinstance(idx, (str, bytes)) or not isinstance(idx, Iterable):
        raise error(f"{argument}[{name!r}] must be a list of neuron indices, got {idx!r}")
    out = []
    for i in idx:
        i = int(i) if isinstance(i, torch.Tensor) else i
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
            raise error(f"{argument}[{name!r}]: neuron index {i!r} out of range; allowed 0..{n - 1}")
        out.append(i)
    return out


def _ffn(by_name: dict, name: str, argument: str) -> FFN:
    if name not in by_name:
        raise SiteError(f"{argument}: unknown ffn {name!r}; allowed: {', '.join(by_name) or '(none)'}")
    return by_name[name]
