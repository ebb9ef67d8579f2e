"""Find the attention sites of a model: where the heads are, how many, and their projections.

A *site* is one multi-head attention block: its query/key/value projections write
``num_heads * head_dim`` (queries) and ``num_kv_heads * head_dim`` (keys, values) features, and its
output projection reads the concatenation of the heads' outputs, ``[..., num_heads * head_dim]``.

Sites are found by shape, not by a list of classes: any module that owns query/key/value/output
projections under the names of an entry of the family table (:mod:`.families`), plus a head size, is a
site. Families that name theirs alike (Llama, Qwen2, Mistral, Gemma ...; BART, Marian, mBART, Whisper ...)
are found through any one entry. A fused q/k/v projection (GPT-2's ``c_attn``, Phi-3's ``qkv_proj``,
Falcon's ``query_key_value``, ModernBERT's ``Wqkv``) is described by its row layout
(:class:`~.layouts.FusedLayout`). A module that holds q/k/v-like projections no site holds is refused by
its path (:func:`unfound_attention`), never silently skipped.

Names are stable and used everywhere (files, plots, CLI): ``{stack}.{layer}.{self|cross}`` where
``stack`` is ``encoder`` for bidirectional self-attention and ``decoder`` for causal self-attention
and for cross-attention (kind ``cross``), e.g. ``encoder.3.self``, ``decoder.1.self``,
``decoder.1.cross``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import nn

from ...errors import UnsupportedModelError
from .families import ALIBI, HEAD_DIM_ATTRS, KV_HEAD_ATTRS, KnownNames, known_names, listed_names, refusal
from .layouts import FusedLayout, fused_order
from .runtime import RepeatHeads, shares_t5_bias

KINDS = ("encoder", "decoder", "cross")
SUPPORTED_TAIL = ("and other models whose attention modules expose q/k/v/o projections and a head size (surgery is "
                  "verified on a shrunk copy first; README: Families)")
_CROSS_NAMES = ("encoder_attn", "EncDecAttention", "crossattention", "cross_attn", "crossattn")


@dataclass(frozen=True)
class Projection:
    """One of q/k/v: ``module`` writes this projection's ``width = heads * head_dim`` output features,
    from ``offset`` on when they are contiguous (a fused projection's rows are in its site's
    ``meta["fused"]``, a :class:`FusedLayout`)."""

    module: nn.Module  # nn.Linear (weight [out, in]), GPT-2 Conv1D (weight [in, out]) or RepeatHeads
    offset: int  # first output feature of this projection inside ``module``
    width: int  # number of output features of this projection (heads * head_dim)


REPR_FIELDS = ("name", "kind", "layer", "num_heads", "num_kv_heads", "head_dim", "path")  # what Site's repr shows


@dataclass(eq=False)
class Site:
    """One attention block of a model.

    ``attention`` is the module that computes the heads (and whose forward a removed site replaces);
    ``o`` is the output projection whose *input* is ``[..., num_heads * head_dim]``.
    """

    name: str
    kind: str  # encoder | decoder | cross
    layer: int
    num_heads: int  # query heads present now
    num_kv_heads: int  # key/value heads present now (== num_heads without GQA)
    head_dim: int
    path: str  # module path of ``attention`` inside the model
    attention: nn.Module
    q: Projection
    k: Projection
    v: Projection
    o: nn.Module
    meta: dict = field(default_factory=dict)  # family details surgery needs (e.g. fused, bert_style)

    def __repr__(self) -> str:  # each field under its attribute's name (modules and meta left out)
        shown = ", ".join(f"{k}={getattr(self, k)!r}" for k in REPR_FIELDS)
        return f"Site({shown})"


def is_conv1d(module: nn.Module) -> bool:
    """GPT-2's Conv1D: a linear layer with weight stored [in, out] and attribute ``nf``."""
    return hasattr(module, "nf") and hasattr(module, "weight") and not isinstance(module, nn.Linear)


def out_features(module: nn.Module) -> int:
    if isinstance(module, RepeatHeads):
        return module.out_features
    return module.weight.shape[1] if is_conv1d(module) else module.weight.shape[0]


def kv_of_heads(site: Site) -> list[int]:
    """For each current query head of ``site``, the base key/value head it reads (GQA groups)."""
    groups = site.num_heads * site.head_dim // site.k.width  # query heads per key/value head seen
    seen = [h // groups for h in range(site.num_heads)]
    if isinstance(site.k.module, RepeatHeads):
        index = site.k.module.index.tolist()
        return [index[j] for j in seen]
    return seen


def head_lists(site: Site) -> list[tuple[nn.Module, str, str]]:
    """Module lists inside the attention with one module per head, as (parent, attribute, side): side
    ``"query"`` (one per query head) or ``"kv"`` (one per key/value head under GQA), e.g. StableLM's
    per-head LayerNorms. Surgery keeps the entries of the kept heads."""
    found = []
    for parent in site.attention.modules():
        for attr, child in parent.named_children():
            if isinstance(child, nn.ModuleList) and len(child) > 1:
                if len(child) == site.num_heads:
                    found.append((parent, attr, "query"))
                elif len(child) == site.num_kv_heads:
                    found.append((parent, attr, "kv"))
    return found


POSITION_BUFFERS = ("inv_freq", "cos_cached", "sin_cached", "original_inv_freq", "embed_positions")  # not heads


def ancestors(root: nn.Module, name: str) -> list[nn.Module]:
    """``root``, the modules on the path to its submodule ``name``, and that submodule."""
    out, module = [], root
    for part in (name.split(".") if name else [])[:-1]:
        out.append(module)
        module = getattr(module, part)
    return out + ([module] if name else [])


def head_tensors(site: Site) -> list[tuple[nn.Module, str, int, str]]:
    """Parameters / buffers of the attention module itself with one entry per head along one dimension,
    as (module, name, dim, side): e.g. gpt-oss's attention sinks ``[heads]`` or Cohere's per-head
    q/k norm weights ``[heads, head_dim]`` (inside a norm module of the attention). ``side`` is
    ``"query"`` or ``"kv"`` (one per key/value head, under GQA). Projections, per-head module lists
    and T5's bias table are handled elsewhere; surgery keeps the kept heads' entries of these."""
    skip = {id(m) for m in (site.q.module, site.k.module, site.v.module, site.o, *site.meta.get("extras", []))}
    skip |= {id(getattr(m, "base", None)) for m in (site.k.module, site.v.module)}
    skip |= {id(getattr(parent, attr)) for parent, attr, _ in head_lists(site)}
    if shares_t5_bias(site.attention):  # T5's table: surgery takes each layer's rows of the shared bias
        skip.add(id(getattr(site.attention, "relative_attention_bias", None)))
    found = []
    for path, module in site.attention.named_modules():
        if id(module) in skip or any(id(m) in skip for m in ancestors(site.attention, path)):
            continue
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, t in tensors:
            if name in POSITION_BUFFERS or t.dim() == 0:
                continue
            for dim, size in enumerate(head_axes(site, module, t.shape)):
                if size == site.num_heads and size > 1:
                    found.append((module, name, dim, "query"))
                    break
                if size == site.num_kv_heads and size > 1:
                    found.append((module, name, dim, "kv"))
                    break
    return found


def head_axes(site: Site, module: nn.Module, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The dimensions of a tensor of ``module`` (inside ``site.attention``) that may count heads: a
    sub-module's last dimension of ``head_dim`` holds features (Qwen3's ``q_norm`` ``[head_dim]``,
    Persimmon's q/k LayerNorm), also where ``head_dim == num_heads``; it is left out."""
    if module is not site.attention and shape and shape[-1] == site.head_dim:
        return tuple(shape[:-1])
    return tuple(shape)


def site_params(site: Site) -> int:
    """Parameters of the site's q/k/v/o projections (a fused projection counted once)."""
    modules = {id(m): m for m in (site.q.module, site.k.module, site.v.module, site.o)}
    return sum(p.numel() for m in modules.values() for p in m.parameters())


def sites_table(model: nn.Module) -> list[dict]:
    """One plain row per site (name, kind, layer, heads, kv_heads, head_dim, params, module): for
    tables, JSON and reports."""
    return [
        {"name": s.name, "kind": s.kind, "layer": s.layer, "heads": s.num_heads, "kv_heads": s.num_kv_heads,
         "head_dim": s.head_dim, "params": site_params(s), "module": s.path}
        for s in find_sites(model)
    ]


_FIXED: dict[int, dict[str, list]] = {}  # id(model) -> what each finder found, inside structure_fixed(model)


@contextmanager
def structure_fixed(model: nn.Module) -> Iterator[None]:
    """Inside, :func:`find_sites` and :func:`headprune.core.model.ffn.find_ffns` search ``model`` once and hand out copies
    of what they found: for loops that change weights (folds, zeroed columns, added biases) but never which modules
    exist or their shapes. Nested uses keep the outer one's findings; leaving the outermost forgets them."""
    if id(model) in _FIXED:
        yield
        return
    _FIXED[id(model)] = {}
    try:
        yield
    finally:
        del _FIXED[id(model)]


def found_once(model: nn.Module, key: str, find: Callable[[], list]) -> list:
    """``find()``, or inside :func:`structure_fixed` the first result for ``key`` (a copy of the list)."""
    cache = _FIXED.get(id(model))
    if cache is None:
        return find()
    if key not in cache:
        cache[key] = find()
    return list(cache[key])


def find_sites(model: nn.Module) -> list[Site]:
    """All attention sites of ``model`` that still have heads, in module order.

    Raises :class:`UnsupportedModelError` naming the model class when none is found.
    """
    return found_once(model, "sites", lambda: _find_sites(model))


def _find_sites(model: nn.Module) -> list[Site]:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if refused := refusal(model_type):
        raise UnsupportedModelError(f"model of class {type(model).__name__} ({model_type}) is not supported: "
                                    f"{refused}; supported families: {supported_families()}")
    if getattr(getattr(model, "config", None), "alibi", None) is True:  # Falcon built with ALiBi
        raise UnsupportedModelError(f"model of class {type(model).__name__} ({model_type}) with alibi=True is not "
                                    f"supported: {ALIBI}")
    quantized = sorted({type(m).__name__ for m in model.modules() if "quantiz" in type(m).__module__})
    if quantized or getattr(getattr(model, "config", None), "quantization_config", None):
        what = ", ".join(quantized) or "quantization_config"
        raise UnsupportedModelError(f"model of class {type(model).__name__} is quantized ({what}); headprune prunes "
                                    "float models: prune first, then quantize")
    sites: list[Site] = []
    seen: set[int] = set()
    names = known_names()  # the family table (:mod:`.families`), read once per search
    for path, module in model.named_modules():
        if id(module) in seen:
            continue
        site = _match(model, path, module, names)
        if site is not None:
            seen.add(id(module))
            sites.append(site)
    if not sites and not _has_removed_sites(model):
        raise UnsupportedModelError(
            f"model of class {type(model).__name__} has no attention sites headprune can find; "
            f"supported families: {supported_families()}"
        )
    if unfound := unfound_attention(model, sites):
        raise UnsupportedModelError(
            f"model of class {type(model).__name__} has attention headprune does not find as a site at {unfound}: "
            "pruning or scoring the other sites would silently leave these out")
    names = [s.name for s in sites]
    if len(set(names)) != len(names):
        raise UnsupportedModelError(
            f"model of class {type(model).__name__}: attention sites do not have unique names ({names})")
    return sites


def supported_families() -> str:
    """The families error messages name (:func:`.families.listed_names`), and what else is found."""
    return ", ".join((*listed_names(), SUPPORTED_TAIL))


def unfound_attention(model: nn.Module, sites: list[Site]) -> list[str]:
    """Paths of modules that look like attention (a query projection beside a key projection, or a fused
    q/k/v projection: the names of :class:`.families.KnownNames`) whose projections belong to no site in
    ``sites``: attention that would run unpruned, unscored and unnamed."""
    names = known_names()
    covered = {id(m) for s in sites for m in (s.q.module, s.k.module, s.v.module, s.o, *s.meta.get("extras", []))}
    covered |= {id(getattr(s.k.module, "base", None)) for s in sites}
    found = []
    for path, module in model.named_modules():
        linear = {n: c for n, c in module.named_children() if isinstance(c, nn.Linear) or is_conv1d(c)}
        fused = [c for n, c in linear.items() if n in names.fused_qkv]
        q = [c for n, c in linear.items() if n in names.queries]
        k = [c for n, c in linear.items() if n in names.keys]
        if any(id(c) not in covered for c in fused) or (q and k and any(id(c) not in covered for c in q + k)):
            found.append(path)
    return found


def _has_removed_sites(model: nn.Module) -> bool:
    config = getattr(model, "config", None)  # surgery records kept heads here (0.1.0: "headprune_plan")
    return bool(getattr(config, "headprune_kept_heads", None) or getattr(config, "headprune_plan", None))


def _head_dim(module: nn.Module, model: nn.Module) -> int | None:
    for attr in HEAD_DIM_ATTRS:
        value = getattr(module, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _match(model: nn.Module, path: str, module: nn.Module, names: KnownNames) -> Site | None:
    children = dict(module.named_children())
    # BERT family: attention.self holds q/k/v, attention.output.dense is the output projection; LED and
    # BigBird-Pegasus: the core is another child (longformer_self_attn, self) and ``output`` is the Linear.
    output = children.get("output")
    out_name = ("output.dense" if isinstance(getattr(output, "dense", None), nn.Linear)
                else "output" if isinstance(output, nn.Linear) else None)
    for core_name, core in children.items() if out_name else ():
        hd = _head_dim(core, model)
        for qkv_names in names.bert_qkv:
            qkv = [getattr(core, n, None) for n in qkv_names]
            if core_name != "output" and all(isinstance(m, nn.Linear) for m in qkv) and hd:
                extras = [getattr(core, n) for n in names.extras if isinstance(getattr(core, n, None), nn.Linear)]
                return _make_site(model, path, core, f"{path}.{core_name}", hd, *[_proj(m) for m in qkv],
                                  module.get_submodule(out_name), meta={"bert_style": out_name, "extras": extras})
    for qkvo in names.qkvo:
        mods = [children.get(n) for n in qkvo]
        if all(isinstance(m, (nn.Linear, RepeatHeads)) for m in mods):
            hd = _head_dim(module, model)
            if hd:
                return _make_site(model, path, module, path, hd, *[_proj(m) for m in mods[:3]], mods[3])
    fused = _fused_site(model, path, module, children, names)
    if fused is not None:
        return fused
    return None


def _fused_site(model: nn.Module, path: str, module: nn.Module, children: dict, known: KnownNames) -> Site | None:
    """A site whose q/k/v are head slices of one fused projection (:class:`FusedLayout`), e.g. GPT-2's
    ``c_attn`` or Phi-3's ``qkv_proj``; ``None`` when the widths do not fit one layout."""
    names = next(((f, o) for f, o in known.fused if f in children and o in children), None)
    hd = _head_dim(module, model)
    if names is None or not hd:
        return None
    fused, o = children[names[0]], children[names[1]]
    if not all(isinstance(m, nn.Linear) or is_conv1d(m) for m in (fused, o)) or out_features(fused) % hd:
        return None
    blocks = out_features(fused) // hd
    # GPT-2 / GPT-BigCode cross-attention: q apart (q_attn), fused [k | v]
    separate_q = next((children[n] for n in known.cross_query if n in children), None)
    if separate_q is not None:
        layout, kv = FusedLayout("blocks", ("k", "v")), blocks // 2
        heads = out_features(separate_q) // hd
    else:
        layout = FusedLayout(fused_order(module, names[0], known.fused_order))
        kv = next((v for a in KV_HEAD_ATTRS if isinstance(v := getattr(module, a, None), int) and v > 0), None)
        if getattr(module, "multi_query", False) is True and not layout.order == "groups":
            kv = 1
        if layout.order == "heads" or kv is None:
            kv = blocks // 3
        heads = blocks - 2 * kv
    if heads <= 0 or heads % kv or len(layout.blocks(heads, kv)) != blocks or (layout.order == "heads" and kv != heads):
        return None
    q = _proj(separate_q) if separate_q is not None else Projection(fused, 0, heads * hd)
    first = layout.blocks(heads, kv).index  # offsets say where k and v start under "blocks" only
    k, v = (Projection(fused, first((p, 0)) * hd if layout.order == "blocks" else 0, kv * hd) for p in ("k", "v"))
    return _make_site(model, path, module, path, hd, q, k, v, o, meta={"fused": layout})


def _make_site(model, path, module, core_path, head_dim, q, k, v, o, meta=None) -> Site:
    num_heads = q.width // head_dim
    num_kv = k.width // head_dim
    if isinstance(k.module, RepeatHeads):
        num_kv = k.module.num_base_heads
    kind = _kind(model, path, module)
    layer = _layer(path)
    stack = "encoder" if kind == "encoder" else "decoder"
    name = f"{stack}.{layer}.{'cross' if kind == 'cross' else 'self'}"
    return Site(name=name, kind=kind, layer=layer, num_heads=num_heads, num_kv_heads=num_kv,
                head_dim=head_dim, path=core_path, attention=_get(model, core_path), q=q, k=k, v=v, o=o,
                meta=dict(meta or {}))


def _proj(module: nn.Module) -> Projection:
    return Projection(module, 0, out_features(module))


def _get(model: nn.Module, path: str) -> nn.Module:
    return model.get_submodule(path) if path else model


def _layer(path: str) -> int:
    match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", path)
    if match is None:
        raise UnsupportedModelError(f"attention module at {path!r} has no layer index in its path")
    return int(match.group(1))


def _kind(model: nn.Module, path: str, module: nn.Module) -> str:
    """What the block does: ``cross`` (attends to another sequence), ``decoder`` (causal) or ``encoder``.

    The module's own flags decide first (``is_cross_attention``; ``is_causal`` or ``is_decoder`` set to
    True, on it or on its BERT-style core), then its path, then the config: a BERT built with ``is_decoder=True``
    lives under ``encoder`` but is causal, and XGLM's causal stack has no ``decoder`` in its path."""
    parts = path.split(".")
    if getattr(module, "is_cross_attention", False) or any(p in _CROSS_NAMES or "cross" in p.lower() for p in parts):
        return "cross"
    for owner in (module, getattr(module, "self", None)):  # False is not conclusive: some decoders mask instead
        if getattr(owner, "is_causal", None) is True or getattr(owner, "is_decoder", None) is True:
            return "decoder"
    if "decoder" in parts:
        return "decoder"
    if "encoder" in parts:
        return "encoder"
    config = getattr(model, "config", None)
    return "decoder" if getattr(config, "is_decoder", False) else "encoder"
