"""What a (pruned) decoder becomes in a GGUF file: llama.cpp's architecture, per-layer shapes, tensors.

One function, :func:`gguf_layout`, reads the model's modules (never its config's head counts, which
pruning leaves stale) and returns a :class:`Layout`: the llama.cpp architecture name, the metadata
llama.cpp reads and every tensor under llama.cpp's name, in PyTorch's ``[out, in]`` layout (the GGUF
writer reverses the axes as llama.cpp expects). Anything llama.cpp cannot run exactly is refused here,
before a byte is written (:class:`GGUFShapeError`).

Families (``config.model_type`` -> llama.cpp architecture, and the module behind each tensor name: the
family table's :class:`~headprune.core.model.families.GGUFNames`):

- ``llama``, ``mistral`` -> ``llama`` when every layer has the same heads and FFN width, else ``deci``
  (llama.cpp's Llama variant whose loader and graph read ``head_count``, ``head_count_kv`` and
  ``feed_forward_length`` per layer; Nemotron-NAS models use it). Query and key rows are permuted per
  head from Hugging Face's rotate-half order to the interleaved pairs llama.cpp's ``llama``/``deci``
  rope rotates (what ``convert_hf_to_gguf.py`` does for Llama).
- ``qwen2`` (q/k/v biases) and ``qwen3`` (per-head q/k RMSNorm) -> ``qwen2`` / ``qwen3``, same heads
  and FFN width in every layer only: llama.cpp builds those layers from one head count.
- ``gemma`` (Gemma 1: GELU-tanh FFN, embeddings scaled by sqrt(hidden), RMSNorm ``x * (1 + w)``, tied
  output) -> ``gemma``, same shapes in every layer only; norm weights are written as ``1 + w`` (what
  ``convert_hf_to_gguf.py`` does), rope rows unpermuted (llama.cpp's gemma rotates halves, as HF does).

Output-projection biases added by bias compensation (``compensate='bias'``: Llama's ``o_proj`` and
``down_proj`` gain one) are written as ``attn_output.bias`` / ``ffn_down.bias``, which llama.cpp's ``llama``
and ``deci`` loaders read when present; other architectures, and a layer that lost every head but keeps a
bias, are refused.

A llama-family layer with no heads left is written as deci's attention-free layer (head counts 0, no
attention tensors: the layer adds nothing, as the pruned model's removed attention does). A layer with no
FFN neurons left is written with ``zero_ffn`` (default :data:`ZERO_FFN`) neurons of zeros (gate, up and down weights all 0: the FFN
adds exactly nothing, plus its down bias where compensation added one, as the pruned layer does; llama.cpp's
deci would skip a layer of width 0 whole, its attention output too); the names are in ``Layout.padded``.
Refused: a qwen layer with no heads, repeated key/value heads (a grouped-query
site pruned unevenly, :class:`~headprune.core.model.runtime.RepeatHeads`: a GGUF layer has one group size),
query heads not a multiple of the layer's key/value heads, a masked model, rope scaling or sliding
windows the exporter does not write, and every other family.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..core.model.families import GGUFNames, gguf_names, gguf_types
from ..core.model.records import ADDED_BIASES_KEY
from ..errors import ConfigError, UnsupportedModelError

PER_LAYER_ARCH = {"llama": "deci"}  # the architecture that reads per-layer shapes, by uniform architecture
# llama.cpp architectures whose loaders read optional attn_output.bias and ffn_down.bias (bias compensation)
BIASED_ARCHS = {"llama", "deci"}
PERMUTED = {"llama", "deci"}  # llama.cpp rotates interleaved pairs (rope "norm"): q/k rows permuted
ZERO_FFN = 256  # neurons of zeros written for an FFN with none left: a multiple of every llama.cpp quantisation block


class GGUFShapeError(UnsupportedModelError):
    """A model (or pruned shape) that a GGUF file cannot hold so that llama.cpp runs it exactly."""


@dataclass
class LayerShape:
    """One decoder layer as llama.cpp sees it."""

    n_head: int
    n_head_kv: int
    n_ff: int


@dataclass
class Layout:
    """A model as GGUF: architecture, metadata values and tensors ``{gguf name: float32 array [out, in]}``."""

    arch: str
    family: str
    hidden: int
    head_dim: int
    layers: list[LayerShape]
    context_length: int
    rms_eps: float
    rope_theta: float
    vocab_size: int
    tied: bool
    names: GGUFNames  # the family's tensor names and llama.cpp's rules for it (the family table)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)  # {gguf name: the model's parameter} (not padded ones)
    permuted: dict[str, int] = field(default_factory=dict)  # {gguf name: heads} of rows permuted for rope
    shifted: dict[str, float] = field(default_factory=dict)  # {gguf name: constant added} (gemma's norms: + 1)
    padded: set[str] = field(default_factory=set)  # gguf names of the zero FFNs written for layers with no neurons
    zero_ffn: int = ZERO_FFN  # their width

    @property
    def uniform(self) -> bool:
        return len({(s.n_head, s.n_head_kv, s.n_ff) for s in self.layers}) == 1

    def per_layer(self, key: str) -> int | list[int]:
        """``n_head`` / ``n_head_kv`` / ``n_ff``: one value when every layer agrees, else one per layer."""
        values = [getattr(s, key) for s in self.layers]
        return values[0] if len(set(values)) == 1 else values


def gguf_layout(model: nn.Module, *, zero_ffn: int = ZERO_FFN) -> Layout:
    """The GGUF layout of ``model`` (a transformers causal LM, pruned by headprune or not); refused with
    :class:`GGUFShapeError` when llama.cpp could not run it exactly. ``zero_ffn``: the neurons of zeros written
    for an FFN with none left (a multiple of the quantisation block the file will use: 32 for Q8_0 / Q4_0, 256
    for K-quants)."""
    from ..core import is_masked  # the public core API only

    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    names = gguf_names(family)
    if names is None:
        raise GGUFShapeError(f"model_type {family!r}: GGUF export supports {', '.join(gguf_types())} "
                             "(decoder families llama.cpp runs and headprune prunes exactly)")
    if is_masked(model):
        raise GGUFShapeError("model has masked heads; unmask it or prune them physically before exporting")
    top = dict(names.model_tensors)
    layers = list(_module(model, names.layers) or [])
    embed, head = _module(model, top["token_embd"]), _module(model, top["output"])
    if not layers or embed is None or head is None:
        raise GGUFShapeError(f"{type(model).__name__} is not a causal LM with {names.layers}, {top['token_embd']} "
                             f"and {top['output']}")
    _check_config(config, family, names)
    hidden = int(embed.weight.shape[1])
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    if not isinstance(zero_ffn, int) or zero_ffn < 1:
        raise ConfigError(f"zero_ffn={zero_ffn!r}; allowed: an integer >= 1 (32 for Q8_0/Q4_0, 256 for K-quants)")
    shapes = [_layer_shape(i, layer, head_dim, family, names) for i, layer in enumerate(layers)]
    for shape in shapes:
        shape.n_ff = shape.n_ff or zero_ffn  # deci would skip a width-0 layer whole (its attention output too)
    uniform = len({(s.n_head, s.n_head_kv, s.n_ff) for s in shapes}) == 1
    arch = names.arch
    if names.query_is_hidden and shapes[0].n_head * head_dim != hidden:  # llama.cpp sizes qwen2's q bias by it
        raise GGUFShapeError(f"{arch} with {shapes[0].n_head} query heads x head_dim {head_dim} != hidden {hidden}: "
                             f"llama.cpp's {arch} loader sizes the query bias by the hidden size; prune FFN neurons "
                             "only")
    if not uniform:
        if arch not in PER_LAYER_ARCH:
            raise GGUFShapeError(f"{family} with different head counts or FFN widths per layer: llama.cpp's {arch} "
                                 "architecture builds every layer from one head count and one FFN width; prune the "
                                 "same number of heads and neurons in every layer (compress --same-per-site) or "
                                 f"export a llama-family model; layers: {_describe(shapes)}")
        arch = PER_LAYER_ARCH[arch]
    emb = embed.weight
    tied = head.weight is emb or head.weight.data_ptr() == emb.data_ptr()
    if names.tied and not tied:  # the tensors decide, not the config's flag
        raise GGUFShapeError(f"{family} whose output layer is not its token embeddings: llama.cpp's {names.arch} reads "
                             "the output layer from the token embeddings; allowed: tied")
    layout = Layout(arch=arch, family=family, hidden=hidden, head_dim=head_dim, layers=shapes,
                    context_length=int(getattr(config, "max_position_embeddings", 2048)),
                    rms_eps=float(config.rms_norm_eps), rope_theta=_rope_theta(config),
                    vocab_size=int(emb.shape[0]), tied=bool(tied), names=names, zero_ffn=zero_ffn)
    _fill_tensors(layout, model, layers)
    return layout


def _module(root: nn.Module, path: str) -> nn.Module | None:
    """The submodule at the dotted ``path`` of ``root``, or None."""
    module = root
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _check_config(config, family: str, names: GGUFNames) -> None:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if kind not in (None, "default"):
        raise GGUFShapeError(f"rope scaling {kind!r}: the GGUF exporter writes plain rope only (rope_type 'default')")
    window = getattr(config, names.window, None) if names.window else None
    if window is True:  # a flag (qwen's use_sliding_window)
        raise GGUFShapeError(f"{family} with {names.window}=True: not written to GGUF; allowed: False")
    if window:  # a window size (mistral's sliding_window)
        raise GGUFShapeError(f"{family} with {names.window}={window}: llama.cpp's {names.arch} architecture attends "
                             f"to the whole context; allowed: {names.window} None")
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if act not in names.activations:
        raise GGUFShapeError(f"hidden_act {act!r}: llama.cpp's {names.arch} FFN applies {names.activations[0]}; "
                             f"allowed: {', '.join(names.activations)}")
    if getattr(config, "attention_bias", False) and not names.qkv_bias:
        raise GGUFShapeError(f"{family} with attention_bias=True: not written to GGUF; allowed: False")
    if getattr(config, "mlp_bias", False):
        raise GGUFShapeError(f"{family} with mlp_bias=True: not written to GGUF; allowed: False")
    biased = list(getattr(config, ADDED_BIASES_KEY, None) or [])
    if biased and names.arch not in BIASED_ARCHS:  # llama.cpp's loader would find tensors it does not read
        raise GGUFShapeError(f"output projection biases added by bias compensation ({', '.join(biased[:3])}"
                             f"{' ...' if len(biased) > 3 else ''}): llama.cpp's {names.arch} reads no "
                             f"attn_output / ffn_down bias; allowed: {', '.join(sorted(BIASED_ARCHS))} families, or a "
                             "model compressed without compensate='bias' (e.g. --compensate reconstruct or none)")


def _layer_shape(i: int, layer: nn.Module, head_dim: int, family: str, names: GGUFNames) -> LayerShape:
    parts = dict(names.layer_tensors)
    attn = _module(layer, parts["attn_q"].rpartition(".")[0])
    q = _module(layer, parts["attn_q"])
    if not isinstance(q, nn.Linear) or q.out_features == 0:
        if family not in PER_LAYER_ARCH:
            raise GGUFShapeError(f"layer {i} has no attention heads left: llama.cpp's {family} layers always attend; "
                                 "keep at least one head (group) per layer (llama-family models export it as deci)")
        if getattr(getattr(attn, "headprune_out", None), "bias", None) is not None:
            raise GGUFShapeError(f"layer {i} has no attention heads left but adds a bias (bias compensation): deci's "
                                 "attention-free layer adds nothing, so the file would differ; allowed: at least one "
                                 "head (group) kept in that layer, or compensate without 'bias'")
        return LayerShape(n_head=0, n_head_kv=0, n_ff=_ffn_width(i, layer, names))
    k, v = _module(layer, parts["attn_k"]), _module(layer, parts["attn_v"])
    if not (isinstance(k, nn.Linear) and isinstance(v, nn.Linear)):
        raise GGUFShapeError(f"layer {i} repeats key/value heads ({type(k).__name__}): its query heads were pruned "
                             "unevenly across key/value groups, which a GGUF layer (one group size) cannot hold; "
                             "prune with --gqa uniform")
    n_head, n_kv = q.out_features // head_dim, k.out_features // head_dim
    if n_kv == 0 or n_head % n_kv or v.out_features != k.out_features:
        raise GGUFShapeError(f"layer {i}: {n_head} query heads over {n_kv} key/value heads; allowed: a multiple")
    return LayerShape(n_head=n_head, n_head_kv=n_kv, n_ff=_ffn_width(i, layer, names))


FFN_PARTS = ("ffn_gate", "ffn_up", "ffn_down")


def _ffn_width(i: int, layer: nn.Module, names: GGUFNames) -> int:
    paths = [dict(names.layer_tensors)[p] for p in FFN_PARTS]
    gate, up, down = (_module(layer, path) for path in paths)
    if not all(isinstance(m, nn.Linear) for m in (gate, up, down)):
        raise GGUFShapeError(f"layer {i}: the FFN is not {'/'.join(p.rpartition('.')[2] for p in paths)} Linear "
                             "layers")
    return gate.out_features  # 0: written as zero_ffn neurons of zeros (gguf_layout)


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        return float(rope["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))


def _describe(shapes: list[LayerShape]) -> str:
    return ", ".join(f"{i}: {s.n_head}/{s.n_head_kv} heads, ffn {s.n_ff}" for i, s in enumerate(shapes))


def rope_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a query/key projection (``[heads * head_dim, ...]`` or a bias) from rotate-half order to the
    interleaved pairs llama.cpp's ``llama`` rope rotates: per head, ``[x0..x(d/2-1), y0..]`` -> ``[x0, y0, x1, ...]``."""
    rest = w.shape[1:]
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *rest).swapaxes(1, 2).reshape(w.shape)


def rope_unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of :func:`rope_permute`."""
    rest = w.shape[1:]
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float32).numpy().copy()


def _fill_tensors(layout: Layout, model: nn.Module, layers: list[nn.Module]) -> None:
    """Every tensor under llama.cpp's name, in the order llama.cpp's converter writes them, and the model
    parameter each one is (``layout.parameters``); the modules are the family's (``layout.names``)."""
    top, parts = dict(layout.names.model_tensors), dict(layout.names.layer_tensors)
    _put(layout, "token_embd.weight", model, f"{top['token_embd']}.weight")
    heads = {"attn_q": "n_head", "attn_k": "n_head_kv", "attn_v": None, "attn_output": None}
    for i, (layer, shape) in enumerate(zip(layers, layout.layers, strict=True)):
        p, at = f"blk.{i}.", f"{layout.names.layers}.{i}."
        if shape.n_head == 0:  # no heads left: deci runs no attention (and reads no attention tensors) here
            _fill_ffn(layout, model, p, at, layer)
            continue
        _norm(layout, p + "attn_norm.weight", model, at + parts["attn_norm"] + ".weight")
        for dst, key in heads.items():
            lin = _module(layer, parts[dst])
            for kind in ("weight", "bias"):
                if getattr(lin, kind, None) is None:
                    continue
                a = _put(layout, f"{p}{dst}.{kind}", model, f"{at}{parts[dst]}.{kind}")
                if key is not None and layout.arch in PERMUTED:
                    layout.tensors[f"{p}{dst}.{kind}"] = rope_permute(a, getattr(shape, key))
                    layout.permuted[f"{p}{dst}.{kind}"] = getattr(shape, key)
        for dst in ("attn_q_norm", "attn_k_norm"):  # per-head q/k norms (qwen3), where the family has them
            if dst in parts:
                _put(layout, f"{p}{dst}.weight", model, f"{at}{parts[dst]}.weight")
        _fill_ffn(layout, model, p, at, layer)
    _norm(layout, "output_norm.weight", model, f"{top['output_norm']}.weight")
    if not layout.tied:
        _put(layout, "output.weight", model, f"{top['output']}.weight")


def _put(layout: Layout, name: str, model: nn.Module, parameter: str) -> np.ndarray:
    """Write the model's ``parameter`` as the tensor ``name``; returns the array."""
    layout.parameters[name] = parameter
    layout.tensors[name] = _array(model.get_parameter(parameter))
    return layout.tensors[name]


def _norm(layout: Layout, name: str, model: nn.Module, parameter: str) -> None:
    """An RMSNorm weight as llama.cpp multiplies by it (gemma's ``1 + w``, recorded in ``layout.shifted``)."""
    if layout.names.norm_plus_one:
        layout.shifted[name] = 1.0
    _put(layout, name, model, parameter)
    layout.tensors[name] = layout.tensors[name] + layout.shifted.get(name, 0.0)


def _fill_ffn(layout: Layout, model: nn.Module, p: str, at: str, layer: nn.Module) -> None:
    """The FFN tensors of the layer ``layer`` (``p``: its GGUF prefix ``blk.{i}.``, ``at``: its module path)."""
    parts = dict(layout.names.layer_tensors)
    _norm(layout, p + "ffn_norm.weight", model, at + parts["ffn_norm"] + ".weight")
    gate, down = _module(layer, parts["ffn_gate"]), _module(layer, parts["ffn_down"])
    if gate.out_features == 0:  # no neurons left: ZERO_FFN of zeros, which add exactly nothing
        names = [f"{p}{part}.weight" for part in FFN_PARTS]
        for name in names:
            width = layout.zero_ffn
            layout.tensors[name] = np.zeros((width, layout.hidden) if "down" not in name else (layout.hidden, width),
                                            dtype=np.float32)
        layout.padded.update(names)
    else:
        for part in FFN_PARTS:
            _put(layout, f"{p}{part}.weight", model, f"{at}{parts[part]}.weight")
    if down.bias is not None:  # added by bias compensation (_check_config allows it per arch)
        _put(layout, p + "ffn_down.bias", model, f"{at}{parts['ffn_down']}.bias")
