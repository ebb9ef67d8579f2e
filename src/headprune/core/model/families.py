"""Model families as one table: what headprune knows about each family's names, as plain data.

One :class:`Family` entry per family says how its modules are named and how it is saved: its attention
projections (separate q/k/v/o, BERT-style q/k/v beside an ``output`` projection, or one fused q/k/v
projection with the row order of :class:`~.layouts.FusedLayout`), its feed-forward projections and the config
keys of their width, whether its stock config can hold a pruned decoder of another family (:mod:`.stock`), why
it is refused, and how llama.cpp's GGUF names its tensors (:class:`GGUFNames`). Site finding (:mod:`.sites`),
FFN finding (:mod:`.ffn`), fused layouts (:mod:`.layouts`), surgery (:mod:`.surgery`), stock saving
(:mod:`.stock`) and the GGUF export (:mod:`headprune.export.gguf_layout`) read this table, nothing else.

Entries are tried in table order (built-in ones first, then those :func:`register_family` adds): a module that
holds the names of two entries is the first one's. Families share names freely (Llama, Qwen2 and Mistral name
theirs alike); each kind of name is read once, in the order it first appears (:func:`known_names`). Adding a
family is one entry and its tests (``tests/test_family_table.py`` adds one at test time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError

# Attribute names under which attention modules keep their sizes, read by site finding and kept current by
# surgery (any of them a module has); the first positive int of HEAD_DIM_ATTRS is the head size.
HEAD_DIM_ATTRS = ("head_dim", "attention_head_size", "key_value_proj_dim", "head_size")
HEAD_COUNT_ATTRS = ("num_heads", "num_attention_heads", "n_heads")  # query heads
KV_HEAD_ATTRS = ("num_key_value_heads", "num_kv_heads", "kv_heads")  # key/value heads an attention module reads
HEADS_WIDTH_ATTRS = ("all_head_size", "inner_dim")  # heads * head_dim
SPLIT_WIDTH_ATTRS = ("embed_dim", "split_size")  # the heads' width where it equals it (XGLM, GPT-2 split by it)

# q / k / fused q/k/v names of attention no entry describes (Meta's original checkpoints, Mamba-style mixers are
# not among them: ``in_proj``): a module holding them is attention no site finds, refused by its path.
OTHER_QUERY_NAMES = ("wq", "Wq")
OTHER_KEY_NAMES = ("wk", "Wk")
OTHER_FUSED_NAMES = ("qkv", "wqkv")

ALIBI = "ALiBi biases are built for all heads outside the attention modules"
LAYOUT_ORDERS = ("blocks", "heads", "groups")  # FusedLayout.order


@dataclass(frozen=True)
class Fused:
    """A fused q/k/v projection ``qkv`` and the output projection ``out`` beside it (child names)."""

    qkv: str
    out: str
    order: str = "blocks"  # FusedLayout order when the module's own flags do not say (layouts.fused_order)
    cross_query: str | None = None  # cross-attention's separate query beside a fused [k | v] (GPT-2's q_attn)

    def __post_init__(self):
        if self.order not in LAYOUT_ORDERS:
            raise ConfigError(f"Fused order={self.order!r}; allowed: {', '.join(LAYOUT_ORDERS)}")


@dataclass(frozen=True)
class FFNNames:
    """A feed-forward block: ``ups`` (up, and gate when gated) write the neurons, ``down`` reads them; dotted
    child paths under one container module."""

    ups: tuple[str, ...]
    down: str


# llama.cpp's tensor names for a Llama-style decoder: {gguf name: module path} of the whole model, and of one
# layer (``blk.{i}.`` + name, paths under ``layers.{i}``); ``.weight`` / ``.bias`` appended to both
LLAMA_MODEL_TENSORS = (("token_embd", "model.embed_tokens"), ("output_norm", "model.norm"), ("output", "lm_head"))
LLAMA_LAYER_TENSORS = (("attn_norm", "input_layernorm"), ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
                       ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
                       ("ffn_norm", "post_attention_layernorm"), ("ffn_gate", "mlp.gate_proj"),
                       ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj"))
QK_NORM_TENSORS = (("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm"))  # Qwen3's per-head norms
# Gemma-3: Qwen3's q/k norms and two more norms per layer, after attention and after the FFN; llama.cpp's ffn_norm is
# the norm before the FFN (Gemma-3's pre_feedforward_layernorm, not its post_attention_layernorm)
GEMMA3_LAYER_TENSORS = (LLAMA_LAYER_TENSORS[:5] + QK_NORM_TENSORS
                        + (("post_attention_norm", "post_attention_layernorm"),
                           ("ffn_norm", "pre_feedforward_layernorm")) + LLAMA_LAYER_TENSORS[6:]
                        + (("post_ffw_norm", "post_feedforward_layernorm"),))
GGUF_LAYER_PARTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                    "ffn_down")  # every GGUFNames.layer_tensors names these; the others below are optional
GGUF_OPTIONAL_PARTS = ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm")


@dataclass(frozen=True)
class SlidingNames:
    """Sliding-window layers llama.cpp applies layer by layer (``{arch}.attention.sliding_window`` and the per-layer
    ``sliding_window_pattern``), each layer type with its own rope base (``rope.freq_base`` for full-attention
    layers, ``rope.freq_base_swa`` for sliding ones): the config keys and layer-type names that say so."""

    window: str = "sliding_window"  # config key of the window (tokens a query sees, itself included)
    layer_types: str = "layer_types"  # config key of the per-layer types
    sliding: str = "sliding_attention"  # the type of a sliding layer; also its rope_parameters entry
    full: str = "full_attention"  # the type of a full-attention layer; also its rope_parameters entry


@dataclass(frozen=True)
class GGUFNames:
    """How a decoder family is written as llama.cpp's GGUF (:mod:`headprune.export.gguf_layout`)."""

    arch: str  # llama.cpp's architecture when every layer has the same shape
    layers: str = "model.layers"  # the module list of decoder layers
    model_tensors: tuple[tuple[str, str], ...] = LLAMA_MODEL_TENSORS  # token_embd, output_norm, output
    layer_tensors: tuple[tuple[str, str], ...] = LLAMA_LAYER_TENSORS  # GGUF_LAYER_PARTS (+ q/k norms)
    activations: tuple[str, ...] = ("silu",)  # the FFN activation llama.cpp's architecture applies
    norm_plus_one: bool = False  # RMSNorm computes x * (1 + w): llama.cpp multiplies by the stored weight, so w + 1
    qkv_bias: bool = False  # llama.cpp's architecture reads q/k/v biases (config attention_bias)
    window: str | None = None  # the config key of a sliding window llama.cpp's architecture does not apply
    query_is_hidden: bool = False  # llama.cpp sizes the query bias by the hidden size (qwen2)
    tied: bool = False  # llama.cpp reads the output layer from the token embeddings (gemma)
    sliding: SlidingNames | None = None  # sliding-window layers llama.cpp applies per layer (gemma3)
    # config key of the attention score scale (scores * value ** -0.5) where llama.cpp's architecture scales by
    # 1 / sqrt(head_dim) instead: the ratio is folded into attn_q_norm's weight (a factor on every query)
    query_scale: str | None = None
    scale_hidden_layers: tuple[int, ...] = ()  # layer counts at which llama.cpp scales by 1 / sqrt(hidden / heads)
    # llama.cpp builds every layer from layer 0's head count and FFN width: uneven layers are written padded with
    # zero heads (their output-projection columns zero) and zero neurons, which add exactly nothing
    pad_layers: bool = False
    unset: tuple[str, ...] = ()  # config keys llama.cpp's architecture does not apply: refused unless None / False

    def __post_init__(self):
        parts = dict(self.layer_tensors)
        missing = [p for p in GGUF_LAYER_PARTS if p not in parts]
        unknown = [p for p in parts if p not in GGUF_LAYER_PARTS + GGUF_OPTIONAL_PARTS]
        if missing or unknown or {p for p, _ in self.model_tensors} != {"token_embd", "output_norm", "output"}:
            raise ConfigError(f"GGUFNames layer_tensors / model_tensors: missing {missing or 'a model tensor'}, "
                              f"unknown {unknown}; allowed: {', '.join(GGUF_LAYER_PARTS)} per layer (optional: "
                              f"{', '.join(GGUF_OPTIONAL_PARTS)}) and token_embd, output_norm, output")
        if self.query_scale and "attn_q_norm" not in parts:
            raise ConfigError(f"GGUFNames query_scale={self.query_scale!r} without attn_q_norm; allowed: a family "
                              "whose layers have a query norm to fold the scale into")


@dataclass(frozen=True)
class Family:
    """One model family's names: what site finding, FFN finding, surgery, stock saving and the GGUF export
    read. Every field but ``name`` is optional: an entry says only what differs from no knowledge at all."""

    name: str  # as messages and the manual name it ("Llama")
    model_types: tuple[str, ...] = ()  # config.model_type values this entry is (refusal, stock, GGUF)
    qkvo: tuple[str, str, str, str] | None = None  # q, k, v, output: children of one attention module
    bert_qkv: tuple[str, str, str] | None = None  # q, k, v of a core child; its sibling output(.dense) is the output
    fused: Fused | None = None
    extras: tuple[str, ...] = ()  # per-head projections beside q/k/v, cut with the query heads (DeBERTa)
    ffns: tuple[FFNNames, ...] = ()
    ffn_keys: tuple[str, ...] = ()  # config keys of the FFN width (trials shrink them; stock sets the kept width)
    stock_target: bool = False  # its config reads head_dim: a pruned decoder of another family may save as it
    gguf: GGUFNames | None = None
    refused: str | None = None  # why models of these model_types are refused before anything is found
    listed: bool = False  # named among the supported families of error messages (its own tests in tests/)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"Family name={self.name!r}; allowed: a non-empty string")
        for what, names, n in (("qkvo", self.qkvo, 4), ("bert_qkv", self.bert_qkv, 3)):
            if names is not None and (len(names) != n or not all(isinstance(s, str) and s for s in names)):
                raise ConfigError(f"Family {self.name!r} {what}={names!r}; allowed: {n} child names")


_DECODER: dict[str, Any] = {"qkvo": ("q_proj", "k_proj", "v_proj", "o_proj"), "ffns": (FFNNames(("gate_proj", "up_proj"), "down_proj"),),
            "ffn_keys": ("intermediate_size",)}
_SEQ2SEQ: dict[str, Any] = {"qkvo": ("q_proj", "k_proj", "v_proj", "out_proj"), "ffns": (FFNNames(("fc1",), "fc2"),)}
_BERT: dict[str, Any] = {"bert_qkv": ("query", "key", "value"), "ffns": (FFNNames(("intermediate.dense",), "output.dense"),),
         "ffn_keys": ("intermediate_size",)}
_QWEN: dict[str, Any] = {"qkv_bias": True, "window": "use_sliding_window"}

# The built-in table, in matching order (see the module docstring).
BUILT_IN: tuple[Family, ...] = (
    Family("Mistral", ("mistral",), **_DECODER, stock_target=True, listed=True,
           gguf=GGUFNames("llama", window="sliding_window")),
    Family("Qwen2", ("qwen2",), **_DECODER, stock_target=True, listed=True,
           gguf=GGUFNames("qwen2", query_is_hidden=True, **_QWEN)),
    Family("Qwen3", ("qwen3",), **_DECODER, stock_target=True,
           gguf=GGUFNames("qwen3", layer_tensors=LLAMA_LAYER_TENSORS[:5] + QK_NORM_TENSORS + LLAMA_LAYER_TENSORS[5:],
                          **_QWEN)),
    Family("Llama", ("llama",), **_DECODER, stock_target=True, listed=True, gguf=GGUFNames("llama")),
    Family("Gemma", ("gemma",), **_DECODER,
           gguf=GGUFNames("gemma", activations=("gelu_pytorch_tanh",), norm_plus_one=True, tied=True)),
    Family("Gemma-3", ("gemma3_text",), **_DECODER,
           gguf=GGUFNames("gemma3", layer_tensors=GEMMA3_LAYER_TENSORS, activations=("gelu_pytorch_tanh",),
                          norm_plus_one=True, tied=True, sliding=SlidingNames(), query_scale="query_pre_attn_scalar",
                          scale_hidden_layers=(62,), pad_layers=True,
                          unset=("attn_logit_softcapping", "final_logit_softcapping",
                                 "use_bidirectional_attention"))),
    Family("Qwen2-MoE", ("qwen2_moe",), **(_DECODER | {"ffn_keys": ("moe_intermediate_size",
                                                                      "shared_expert_intermediate_size")})),
    Family("GPT-2", ("gpt2",), fused=Fused("c_attn", "c_proj", cross_query="q_attn"),
           ffns=(FFNNames(("c_fc",), "c_proj"),), ffn_keys=("n_inner",), listed=True),
    Family("Phi-3", ("phi3",), fused=Fused("qkv_proj", "o_proj"), ffn_keys=("intermediate_size",), listed=True),
    Family("Phi-1 / Phi-2", ("phi",), qkvo=("q_proj", "k_proj", "v_proj", "dense"), ffns=(FFNNames(("fc1",), "fc2"),),
           ffn_keys=("intermediate_size",)),
    Family("ModernBERT", ("modernbert", "modernbert-decoder"), qkvo=("q_proj", "k_proj", "v_proj", "Wo"),
           fused=Fused("Wqkv", "Wo"), ffn_keys=("intermediate_size",), listed=True),
    Family("OPT", ("opt",), **_SEQ2SEQ, ffn_keys=("ffn_dim",)),
    Family("BART", ("bart",), **_SEQ2SEQ, ffn_keys=("encoder_ffn_dim", "decoder_ffn_dim"), listed=True),
    Family("Marian", ("marian",), **_SEQ2SEQ, ffn_keys=("encoder_ffn_dim", "decoder_ffn_dim"), listed=True),
    Family("DistilBERT", ("distilbert",), qkvo=("q_lin", "k_lin", "v_lin", "out_lin"), ffns=(FFNNames(("lin1",), "lin2"),),
           listed=True),
    Family("T5", ("t5", "mt5", "longt5"), qkvo=("q", "k", "v", "o"),
           ffns=(FFNNames(("wi_0", "wi_1"), "wo"), FFNNames(("wi",), "wo")), ffn_keys=("d_ff",), listed=True),
    Family("Falcon", ("falcon",), fused=Fused("query_key_value", "dense", order="heads"), listed=True),
    Family("GPT-BigCode", ("gpt_bigcode",), fused=Fused("c_attn", "c_proj", cross_query="q_attn"),
           ffns=(FFNNames(("c_fc",), "c_proj"),), ffn_keys=("n_inner",), listed=True),
    Family("GPT-NeoX", ("gpt_neox",), fused=Fused("query_key_value", "dense", order="heads"),
           ffn_keys=("intermediate_size",), listed=True),
    Family("Persimmon", ("persimmon",), fused=Fused("query_key_value", "dense", order="heads"),
           ffn_keys=("intermediate_size",), listed=True),
    Family("BERT", ("bert",), **_BERT, listed=True),
    Family("RoBERTa", ("roberta",), **_BERT, listed=True),
    Family("ELECTRA", ("electra",), **_BERT, listed=True),
    Family("DeBERTa", ("deberta", "deberta-v2"), bert_qkv=("query_proj", "key_proj", "value_proj"),
           extras=("pos_key_proj", "pos_query_proj"), ffns=_BERT["ffns"], ffn_keys=("intermediate_size",)),
    Family("Longformer", ("longformer",), **_BERT, extras=("query_global", "key_global", "value_global")),
    Family("BLOOM", ("bloom",), refused=ALIBI),
    Family("MPT", ("mpt",), refused=ALIBI),
    Family("ALBERT", ("albert",), refused="one attention module is shared by every layer"),
)

_TABLE: list[Family] = list(BUILT_IN)  # the table: the built-in entries, then what register_family adds


def register_family(family: Family) -> Family:
    """Add ``family`` to the table (tried after the entries already there); returns it. Registering the same
    entry again changes nothing; another entry under a name already taken is refused."""
    if not isinstance(family, Family):
        raise ConfigError(f"family={family!r}; allowed: a headprune.core.model.families.Family")
    old = next((f for f in _TABLE if f.name == family.name), None)
    if old is not None and old != family:
        raise ConfigError(f"register_family: name {family.name!r} is taken by another entry; allowed: a new name")
    if old is None:
        _TABLE.append(family)
    return family


def families() -> tuple[Family, ...]:
    """The table, in matching order."""
    return tuple(_TABLE)


def _unique(values) -> tuple:
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class KnownNames:
    """Each kind of name of the table, once, in the order it first appears: what a search reads."""

    qkvo: tuple[tuple[str, str, str, str], ...]
    bert_qkv: tuple[tuple[str, str, str], ...]
    fused: tuple[tuple[str, str], ...]  # (fused q/k/v, output)
    fused_order: dict[str, str] = field(default_factory=dict)  # fused q/k/v name -> FusedLayout order
    cross_query: tuple[str, ...] = ()
    extras: tuple[str, ...] = ()
    ffns: tuple[tuple[tuple[str, ...], str], ...] = ()  # (ups, down), gated ones first (the more specific)
    queries: frozenset[str] = frozenset()  # query / key / fused q/k/v names that mark attention (sites.unfound_attention)
    keys: frozenset[str] = frozenset()
    fused_qkv: frozenset[str] = frozenset()


def known_names() -> KnownNames:
    """The names of the current table (:class:`KnownNames`)."""
    table = families()
    fused = [f.fused for f in table if f.fused is not None]
    qkvo = _unique(f.qkvo for f in table if f.qkvo is not None)
    bert = _unique(f.bert_qkv for f in table if f.bert_qkv is not None)
    return KnownNames(
        qkvo=qkvo, bert_qkv=bert, fused=_unique((f.qkv, f.out) for f in fused),
        fused_order={f.qkv: f.order for f in reversed(fused)},  # the first entry's order wins
        cross_query=_unique(f.cross_query for f in fused if f.cross_query),
        extras=_unique(e for f in table for e in f.extras),
        ffns=tuple(sorted(_unique((n.ups, n.down) for f in table for n in f.ffns), key=lambda n: -len(n[0]))),
        queries=frozenset([n[0] for n in qkvo + bert] + list(OTHER_QUERY_NAMES)),
        keys=frozenset([n[1] for n in qkvo + bert] + list(OTHER_KEY_NAMES)),
        fused_qkv=frozenset([f.qkv for f in fused] + list(OTHER_FUSED_NAMES)))


def ffn_keys() -> tuple[str, ...]:
    """Config keys that name an FFN width, over the whole table."""
    return _unique(k for f in families() for k in f.ffn_keys)


def stock_targets() -> tuple[str, ...]:
    """model_types whose stock config a pruned decoder of another family may be saved as, in the order tried."""
    return _unique(t for f in families() if f.stock_target for t in f.model_types)


def refusal(model_type: str | None) -> str | None:
    """Why models of ``model_type`` are refused, or None."""
    return next((f.refused for f in families() if model_type in f.model_types and f.refused), None)


def listed_names() -> tuple[str, ...]:
    """The families error messages name as supported."""
    return tuple(f.name for f in families() if f.listed)


def gguf_names(model_type: str | None) -> GGUFNames | None:
    """How ``model_type`` is written as GGUF (the first entry of that model_type that says), or None."""
    return next((f.gguf for f in families() if model_type in f.model_types and f.gguf is not None), None)


def gguf_types() -> list[str]:
    """The model_types the GGUF export writes, sorted."""
    return sorted({t for f in families() if f.gguf is not None for t in f.model_types})
