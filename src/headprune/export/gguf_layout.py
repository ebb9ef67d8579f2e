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

- ``gemma3_text`` (Gemma-3: Gemma's FFN, embedding scale, ``1 + w`` norms and tied output, plus per-head q/k
  norms, a norm after attention and one after the FFN, sliding-window layers interleaved with full ones, each
  kind with its own rope base) -> ``gemma3``: the q/k norms as ``attn_q_norm`` / ``attn_k_norm``, the extra
  norms as ``post_attention_norm`` / ``post_ffw_norm`` (``ffn_norm`` is the norm before the FFN), all ``1 + w``;
  ``attention.sliding_window``, the per-layer ``attention.sliding_window_pattern`` (booleans: llama.cpp applies
  the window to the layers marked true) and ``rope.freq_base_swa`` from the config's layer types and its rope
  base per type. llama.cpp scales attention scores by ``1 / sqrt(head_dim)`` (``1 / sqrt(hidden // heads)`` at
  62 layers), not by the config's ``query_pre_attn_scalar``: where they differ the ratio is folded into the
  query norm's weight (``Layout.scaled``). llama.cpp's gemma3 loader and graph read layer 0's head counts and FFN
  width for every layer (a file with per-layer arrays fails to load), so uneven layers are written **padded**
  to one shape: the most key/value heads of any layer, the largest group, the widest FFN; a layer's kept key/value
  heads take the first slots, each one's query heads the first slots of its group, and the slots left are zeros
  (a zero query head's output-projection columns are zero, a zero neuron's gate, up and down weights are zero: both
  add exactly nothing, as do a layer's heads or neurons all removed). The model's own counts are
  ``Layout.kept`` (the report's ``kept``), the padded tensors' rows ``Layout.placed``. Refused: logit
  softcapping and bidirectional attention (llama.cpp's gemma3 applies neither), rope scaling.

The family table's :class:`~headprune.core.model.families.GGUFNames` holds each of these rules as data: the layer
tensors, ``norm_plus_one``, ``sliding`` (:class:`~headprune.core.model.families.SlidingNames`), ``query_scale``
and ``scale_hidden_layers``, ``pad_layers``, ``unset``.

Output-projection biases added by bias compensation (``compensate='bias'``: Llama's ``o_proj`` and
``down_proj`` gain one) are written as ``attn_output.bias`` / ``ffn_down.bias``, which llama.cpp's ``llama``
and ``deci`` loaders read when present; other architectures, and a layer that lost every head but keeps a
bias, are refused.

A llama-family layer with no heads left is written as deci's attention-free layer (head counts 0, no
attention tensors: the layer adds nothing, as the pruned model's removed attention does). A layer with no
FFN neurons left is written with ``zero_ffn`` (default :data:`ZERO_FFN`) neurons of zeros (gate, up and down weights all 0: the FFN
adds exactly nothing, plus its down bias where compensation added one, as the pruned layer does; llama.cpp's
deci would skip a layer of width 0 whole, its attention output too); the names are in ``Layout.padded``.
Refused: a qwen or gemma (1) layer with no heads, repeated key/value heads (a grouped-query
site pruned unevenly, :class:`~headprune.core.model.runtime.RepeatHeads`: a GGUF layer has one group size),
query heads not a multiple of the layer's key/value heads, a masked model, rope scaling or sliding
windows the exporter does not write, and every other family.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..core.model.families import GGUFNames, SlidingNames, gguf_names, gguf_types
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
    padded: set[str] = field(default_factory=set)  # gguf names of tensors that are all zeros (no model parameter)
    zero_ffn: int = ZERO_FFN  # the width of a zero FFN written for a layer with no neurons
    kept: list[LayerShape] = field(default_factory=list)  # the model's own shapes (layers: as written)
    # {gguf name: (axis, the model's rows / columns in it)}: a tensor padded with zero heads or neurons
    placed: dict[str, tuple[int, np.ndarray]] = field(default_factory=dict)
    scaled: dict[str, float] = field(default_factory=dict)  # {gguf name: factor applied after the shift} (q norm)
    sliding_window: int | None = None  # tokens a sliding layer's query sees (itself included)
    swa_layers: list[bool] | None = None  # per layer: sliding (True) or full attention
    rope_theta_swa: float | None = None  # the sliding layers' rope base

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
    if names.sliding is not None:
        _check_sliding(config, family, names.sliding, len(layers))
    hidden = int(embed.weight.shape[1])
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    if not isinstance(zero_ffn, int) or zero_ffn < 1:
        raise ConfigError(f"zero_ffn={zero_ffn!r}; allowed: an integer >= 1 (32 for Q8_0/Q4_0, 256 for K-quants)")
    kept = [_layer_shape(i, layer, head_dim, family, names) for i, layer in enumerate(layers)]
    if names.pad_layers:  # llama.cpp reads layer 0's shapes for every layer: all padded to one
        shapes = _padded(kept, zero_ffn, family)
    else:  # deci would skip a width-0 layer whole (its attention output too)
        shapes = [LayerShape(s.n_head, s.n_head_kv, s.n_ff or zero_ffn) for s in kept]
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
                    rms_eps=float(config.rms_norm_eps), rope_theta=_rope_theta(config, names, "full"),
                    vocab_size=int(emb.shape[0]), tied=bool(tied), names=names, zero_ffn=zero_ffn, kept=kept)
    if names.sliding is not None:
        sliding = names.sliding
        layout.sliding_window = int(getattr(config, sliding.window))
        layout.swa_layers = [t == sliding.sliding for t in getattr(config, sliding.layer_types)]
        layout.rope_theta_swa = _rope_theta(config, names, "sliding")
    _fill_tensors(layout, model, layers)
    if names.query_scale:
        _fold_query_scale(layout, float(getattr(config, names.query_scale)))
    return layout


def _padded(kept: list[LayerShape], zero_ffn: int, family: str | None) -> list[LayerShape]:
    """One shape for every layer that holds each layer's kept heads and neurons: the most key/value heads, the
    largest group (query heads per key/value head) and the widest FFN of any layer. A layer's kept heads go to the
    first slots of their group (:func:`_head_slots`), the rest are zeros."""
    kv = max(s.n_head_kv for s in kept)
    if kv == 0:
        raise GGUFShapeError(f"{family} with no attention heads left in any layer; allowed: at least one head")
    group = max(s.n_head // s.n_head_kv for s in kept if s.n_head_kv)
    ff = max(s.n_ff for s in kept) or zero_ffn
    return [LayerShape(n_head=kv * group, n_head_kv=kv, n_ff=ff) for _ in kept]


def _head_slots(kept: LayerShape, written: LayerShape) -> tuple[list[int], list[int]]:
    """Where a layer's kept query and key/value heads sit among the written ones: key/value head j in slot j, its
    query heads in the first slots of group j (llama.cpp's query head h reads key/value head h // group)."""
    if kept.n_head_kv == 0:
        return [], []
    have, group = kept.n_head // kept.n_head_kv, written.n_head // written.n_head_kv
    return [j * group + r for j in range(kept.n_head_kv) for r in range(have)], list(range(kept.n_head_kv))


def _fold_query_scale(layout: Layout, scalar: float) -> None:
    """Attention scores scaled by ``scalar ** -0.5`` where llama.cpp scales by ``1 / sqrt(head_dim)`` (or, at the
    layer counts of ``scale_hidden_layers``, ``1 / sqrt(hidden // heads of layer 0)``): the ratio multiplies the
    query norm's weight, so every query, and so every score, is scaled by it (rope is linear)."""
    names = layout.names
    base = layout.hidden // layout.layers[0].n_head if len(layout.layers) in names.scale_hidden_layers \
        else layout.head_dim
    if not scalar > 0:
        raise GGUFShapeError(f"{names.query_scale}={scalar}; allowed: a positive number")
    factor = (base / scalar) ** 0.5
    if factor == 1.0:
        return
    for name in [n for n in layout.tensors if n.endswith("attn_q_norm.weight")]:
        layout.scaled[name] = factor
        layout.tensors[name] = layout.tensors[name] * np.float32(factor)


def _module(root: nn.Module, path: str) -> nn.Module | None:
    """The submodule at the dotted ``path`` of ``root``, or None."""
    module = root
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _check_config(config, family: str, names: GGUFNames) -> None:
    for rope in _ropes(config, names).values():
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if kind not in (None, "default"):
            raise GGUFShapeError(f"rope scaling {kind!r}: the GGUF exporter writes plain rope only (rope_type "
                                 "'default')")
    for key in names.unset:
        if getattr(config, key, None) not in (None, False):
            raise GGUFShapeError(f"{family} with {key}={getattr(config, key)!r}: llama.cpp's {names.arch} does not "
                                 f"apply it; allowed: {key} None")
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


def _check_sliding(config, family: str | None, sliding: SlidingNames, n_layers: int) -> None:
    """Sliding-window layers llama.cpp applies: a window of at least one token and one known type per layer."""
    window = getattr(config, sliding.window, None)
    types = getattr(config, sliding.layer_types, None) or []
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise GGUFShapeError(f"{family} with {sliding.window}={window!r}; allowed: an integer >= 1 (llama.cpp's "
                             "sliding layers need a window)")
    unknown = sorted({str(t) for t in types} - {sliding.sliding, sliding.full})
    if len(types) != n_layers or unknown:
        raise GGUFShapeError(f"{family} with {sliding.layer_types}: {len(types)} entries for {n_layers} layers, "
                             f"unknown {unknown}; allowed: one of {sliding.sliding!r}, {sliding.full!r} per layer")


def _layer_shape(i: int, layer: nn.Module, head_dim: int, family: str, names: GGUFNames) -> LayerShape:
    parts = dict(names.layer_tensors)
    attn = _module(layer, parts["attn_q"].rpartition(".")[0])
    q = _module(layer, parts["attn_q"])
    if not isinstance(q, nn.Linear) or q.out_features == 0:
        if family not in PER_LAYER_ARCH and not names.pad_layers:
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


def _ropes(config, names: GGUFNames) -> dict[str, dict]:
    """The rope settings per kind of layer: ``{"full": ..., "sliding": ...}`` where the config holds one per layer
    type (transformers 5's Gemma-3 ``rope_parameters``), else ``{"full": ...}``."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    sliding = names.sliding
    if sliding is not None and isinstance(rope, dict) and sliding.full in rope:
        return {"full": rope.get(sliding.full) or {}, "sliding": rope.get(sliding.sliding) or {}}
    return {"full": rope}


def _rope_theta(config, names: GGUFNames, kind: str) -> float:
    """The rope base of the ``kind`` ("full" or "sliding") layers; a config without one per layer type gives its
    one base (``rope_theta``, else ``rope_local_base_freq`` for sliding layers, as transformers 4 wrote them)."""
    rope = _ropes(config, names).get(kind)
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        return float(rope["rope_theta"])
    key = "rope_local_base_freq" if kind == "sliding" else "rope_theta"
    return float(getattr(config, key, None) or getattr(config, "rope_theta", 10000.0))


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


# parts of a layer deci's attention-free layer has none of
ATTENTION_PARTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                   "post_attention_norm")
# projections whose rows (axis 0) or columns (axis 1) are query heads, key/value heads or FFN neurons
SLOTTED = {"attn_q": (0, "q"), "attn_k": (0, "kv"), "attn_v": (0, "kv"), "attn_output": (1, "q"),
           "ffn_gate": (0, "ff"), "ffn_up": (0, "ff"), "ffn_down": (1, "ff")}
ROPE_HEADS = {"attn_q": "n_head", "attn_k": "n_head_kv"}  # rows permuted for rope, by these heads


def _fill_tensors(layout: Layout, model: nn.Module, layers: list[nn.Module]) -> None:
    """Every tensor under llama.cpp's name, layer parts in the family table's order, and the model parameter each
    one is (``layout.parameters``); the modules are the family's (``layout.names``)."""
    top = dict(layout.names.model_tensors)
    _put(layout, "token_embd.weight", model, f"{top['token_embd']}.weight")
    for i, (layer, kept, shape) in enumerate(zip(layers, layout.kept, layout.layers, strict=True)):
        p, at = f"blk.{i}.", f"{layout.names.layers}.{i}."
        for part, path in layout.names.layer_tensors:
            if shape.n_head == 0 and part in ATTENTION_PARTS:  # deci runs no attention (and reads none) here
                continue
            if part in SLOTTED:
                _projection(layout, model, _module(layer, path), p + part, at + path, (kept, shape))
            elif _module(layer, path) is None:  # a q/k norm of an attention with no heads left: never used
                layout.tensors[f"{p}{part}.weight"] = np.ones(layout.head_dim, dtype=np.float32)
                layout.padded.add(f"{p}{part}.weight")
            else:
                _norm(layout, f"{p}{part}.weight", model, f"{at}{path}.weight")
    _norm(layout, "output_norm.weight", model, f"{top['output_norm']}.weight")
    if not layout.tied:
        _put(layout, "output.weight", model, f"{top['output']}.weight")


def _slots(layout: Layout, part: str, kept: LayerShape, shape: LayerShape) -> tuple[np.ndarray, int]:
    """The rows (or columns) of ``part``'s weight that the model's kept heads / neurons fill in the file, and how
    many the file has: all of them in order, unless the layer is padded to a wider shape (:func:`_padded`)."""
    axis, kind = SLOTTED[part]
    if kind == "ff":
        return np.arange(kept.n_ff), shape.n_ff
    q, kv = _head_slots(kept, shape)
    slots, n = (q, shape.n_head) if kind == "q" else (kv, shape.n_head_kv)
    rows = np.asarray(slots, dtype=np.int64)[:, None] * layout.head_dim + np.arange(layout.head_dim)
    return rows.reshape(-1), n * layout.head_dim


def _projection(layout: Layout, model: nn.Module, lin: nn.Module | None, name: str, parameter: str,
                shapes: tuple[LayerShape, LayerShape]) -> None:
    """A projection's weight (and bias) as ``name.weight`` (``name.bias``), its heads or neurons at their slots
    of the written shape; zeros where the layer kept none (an FFN with no neurons: the layer adds nothing)."""
    kept, shape = shapes
    part = name.rpartition(".")[2]
    axis, _ = SLOTTED[part]
    index, size = _slots(layout, part, kept, shape)
    for kind in ("weight", "bias"):
        tname = f"{name}.{kind}"
        if kind == "weight" and not len(index):
            layout.tensors[tname] = np.zeros((size, layout.hidden) if axis == 0 else (layout.hidden, size),
                                             dtype=np.float32)
            layout.padded.add(tname)
            continue
        if getattr(lin, kind, None) is None:
            continue
        a = _put(layout, tname, model, f"{parameter}.{kind}")
        if part in ROPE_HEADS and layout.arch in PERMUTED:
            layout.permuted[tname] = getattr(kept, ROPE_HEADS[part])
            a = layout.tensors[tname] = rope_permute(a, layout.permuted[tname])
        if len(index) != size and (kind == "weight" or axis == 0):  # an output bias is over the hidden size
            out = np.zeros((*a.shape[:axis], size, *a.shape[axis + 1:]), dtype=np.float32)
            out[(slice(None),) * axis + (index,)] = a
            layout.tensors[tname] = out
            layout.placed[tname] = (axis, index)


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
