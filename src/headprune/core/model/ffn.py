"""Find the feed-forward blocks (FFNs) of a model: its up/gate projections and its down projection.

An *FFN* computes ``down(act(up(x)))`` (or ``down(act(gate(x)) * up(x))`` when gated): each of its
``width`` intermediate features -- a *neuron* -- is one row of every up/gate projection and one column
of the down projection, and neurons never mix before the down projection (the activation is
elementwise). Masking a neuron scales the down projection's input feature; removing it drops those
rows and that column (:mod:`.neurons`).

FFNs are found by child names under one module, as sites are (:mod:`.sites`), the names of the family
table (:mod:`.families`)::

    BERT, RoBERTa, ELECTRA        intermediate.dense -> output.dense
    DistilBERT                    lin1 -> lin2
    GPT-2                         c_fc -> c_proj        (Conv1D, weights stored [in, out])
    Llama, Qwen2, Mistral ...     gate_proj, up_proj -> down_proj
    BART, Marian, mBART ...       fc1 -> fc2
    T5 / gated T5 (v1.1, mT5)     wi -> wo / wi_0, wi_1 -> wo

Names follow the sites': ``{stack}.{layer}.ffn`` (``encoder.3.ffn``, ``decoder.1.ffn``), with the stack
of the self-attention site of the same layer. Mixture-of-experts layers (one FFN chosen per token) are
refused: a neuron there belongs to one expert among many.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from ...errors import UnsupportedModelError
from .families import known_names
from .records import ORIGINAL_KEY, config_record
from .sites import find_sites, found_once, is_conv1d

_MOE_HINTS = ("experts", "block_sparse_moe", "moe")


@dataclass(eq=False)
class FFN:
    """One feed-forward block: ``ups`` write the ``width`` intermediate features, ``down`` reads them."""

    name: str  # {stack}.{layer}.ffn
    layer: int
    path: str  # module path of the container holding ups and down
    ups: list[nn.Module]  # nn.Linear (weight [width, d]) or Conv1D (weight [d, width])
    down: nn.Module  # nn.Linear (weight [d, width]) or Conv1D (weight [width, d])

    @property
    def width(self) -> int:
        return in_features(self.down)

    @property
    def gated(self) -> bool:
        return len(self.ups) > 1

    def __repr__(self) -> str:
        return f"FFN({self.name!r}, width={self.width}, gated={self.gated}, path={self.path!r})"


def in_features(module: nn.Module) -> int:
    return module.weight.shape[0] if is_conv1d(module) else module.weight.shape[1]


def out_features(module: nn.Module) -> int:
    return module.weight.shape[1] if is_conv1d(module) else module.weight.shape[0]


def find_ffns(model: nn.Module, *, skip_moe: bool = False) -> list[FFN]:
    """Every FFN of ``model`` in module order; raises :class:`UnsupportedModelError` for MoE models (``skip_moe``:
    returns no FFN for them instead, for heads-only work that only counts or refits around FFNs)."""
    return found_once(model, f"ffns:{skip_moe}", lambda: _find_ffns(model, skip_moe=skip_moe))


def _find_ffns(model: nn.Module, *, skip_moe: bool) -> list[FFN]:
    try:
        _refuse_moe(model)
    except UnsupportedModelError:
        if skip_moe:
            return []
        raise
    stacks = {_prefix(s.path): s.name.split(".")[0] for s in find_sites(model) if s.kind != "cross"}
    found: list[FFN] = []
    names = known_names()  # (up/gate child names, down child name) in table order: names.ffns
    for path, module in model.named_modules():
        for ups, down in names.ffns:
            parts = [_child(module, n) for n in (*ups, down)]
            if any(p is None for p in parts):
                continue
            if not all(isinstance(p, nn.Linear) or is_conv1d(p) for p in parts):
                continue
            if any(out_features(u) != in_features(parts[-1]) for u in parts[:-1]):
                continue
            if any(o == down and _child(module, f) is not None for f, o in names.fused):  # GPT-2's attention
                continue
            layer = _layer(path)
            if layer is None:
                continue
            stack = stacks.get(_prefix(path)) or _stack(model, path, layer)
            found.append(FFN(f"{stack}.{layer}.ffn", layer, path, parts[:-1], parts[-1]))
            break
    found_names = [f.name for f in found]
    if len(set(found_names)) != len(found_names):
        raise UnsupportedModelError(f"more than one feed-forward block per layer ({found_names}); neurons of this model "
                                    "cannot be named per layer")
    return found


def _stack(model: nn.Module, path: str, layer: int) -> str:
    """The stack of a layer whose self-attention site surgery removed: from the site names recorded before
    pruning (so an FFN keeps its name when its layer loses every head), else from the path. The recorded name
    comes first: an encoder family run as a causal LM (RoBERTa, RemBERT with ``is_decoder``) keeps its layers
    under an ``encoder`` path while its sites are named ``decoder``."""
    recorded = {n.split(".")[0] for n in (config_record(model.config, ORIGINAL_KEY) or {})
                if n.split(".")[1:2] == [str(layer)] and not n.endswith(".cross")}
    if len(recorded) == 1:
        return recorded.pop()
    parts = path.split(".")
    for stack in ("decoder", "encoder"):
        if stack in parts:
            return stack
    return "encoder"


def _refuse_moe(model: nn.Module) -> None:
    for path, module in model.named_modules():
        last = path.rsplit(".", 1)[-1].lower()
        if last in _MOE_HINTS or "moe" in type(module).__name__.lower():
            raise UnsupportedModelError(f"{type(model).__name__} has mixture-of-experts layers ({path!r}); neuron "
                                        "pruning supports dense feed-forward blocks only")


def _child(module: nn.Module, dotted: str) -> nn.Module | None:
    for part in dotted.split("."):
        module = module._modules.get(part) if isinstance(module, nn.Module) else None
        if module is None:
            return None
    return module


def _layer(path: str) -> int | None:
    match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", path)
    return None if match is None else int(match.group(1))


def _prefix(path: str) -> str:
    """The path up to and including the layer index (``bert.encoder.layer.3``)."""
    match = re.search(r"^(.*?(?:^|\.)\d+)(?:\.|$)", path)
    return match.group(1) if match else path
