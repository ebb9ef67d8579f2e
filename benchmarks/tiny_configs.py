"""Tiny configs for ``benchmarks/families.py``: any transformers model type's default config, shrunk by
generic rules on its field names (few layers, small width, 4 heads / 2 key-value heads, small FFN,
vocabulary, positions, experts, windows), plus a short table of per-family overrides where no generic
rule applies. Nothing is downloaded; the configs are built from the library's defaults.
"""

from __future__ import annotations

import copy

from transformers import PretrainedConfig
from transformers.models.auto import configuration_auto, modeling_auto

LAYERS, WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, POSITIONS = 2, 64, 4, 2, 16, 64, 96, 128
EXPERTS, TOP_K, WINDOW, IMAGE, PATCH = 4, 2, 4, 64, 8

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers", "num_encoder_layers")
WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "model_dim", "d_embed", "emb_dim", "embed_dim")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
             "decoder_attention_heads", "decoder_num_attention_heads")
KV_KEYS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num",
           "encoder_key_value_heads", "decoder_key_value_heads")
HEAD_DIM_KEYS = ("head_dim", "d_kv", "d_head", "attention_head_dim", "kv_channels", "attention_head_size",
                 "v_head_dim", "index_head_dim")
FFN_KEYS = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner", "d_inner",
            "hidden_dim", "mlp_dim", "moe_intermediate_size", "shared_expert_intermediate_size",
            "expert_intermediate_size", "ffn_hidden_size", "moe_hidden_size")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k", "moe_k", "top_k_experts")
# small fixed values: multi-head latent attention ranks, shared experts, expert and state-space groups,
# sparse-attention indexers, embeddings, partial rotary
SMALL = {"kv_lora_rank": 32, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "qk_head_dim": 16,
         "n_shared_experts": 1, "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
         "num_expert_group": 1, "n_groups": 1, "mamba_n_groups": 1, "index_n_heads": 4, "index_topk": 4,
         "index_kpool": 4, "embedding_size": 32, "hidden_size_per_layer_input": 16, "rotary_dim": 8}
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_sequence_length",
                 "max_target_positions", "max_source_positions")
WINDOW_KEYS = ("sliding_window", "attention_window", "local_window_size", "window_size")
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2, "sep_token_id": 2,
          "cls_token_id": 1, "unk_token_id": 3, "mask_token_id": 3}
LAYER_LISTS = ("layer_indices", "layer_ids", "_layers", "layers_block_type_indices")
UNSET = {"vocab_size": VOCAB, **dict.fromkeys(EXPERT_KEYS, EXPERTS), **dict.fromkeys(TOP_K_KEYS, TOP_K),
         "n_shared_experts": 1, "num_shared_experts": 1}
STAGE_KEYS = ("hidden_sizes", "embed_dim", "num_heads", "num_attention_heads", "depths")
KIND_KEYS = ("layer_types", "layers_block_type", "block_types", "attention_layers")  # one kind per layer
TEXT_SUBCONFIGS = ("text_config", "encoder_config", "decoder_config", "attn_config", "ffn_config")

# Per-family overrides where no generic rule applies (merged over the generic rules' result).
OVERRIDES: dict[str, dict] = {
    # -- hybrids whose attention layers the generic two layers would miss
    # attention every 8th layer from the 4th by default
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    # attn_layer_indices defaults to None: no attention layer at all
    "bamba": {"attn_layer_indices": [1]},
    # block_types is a cycle of three (recurrent, recurrent, attention)
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # one attention block shared by the hybrid layers and tied across them: two hybrid layers are needed
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},
    # layer_types defaults to None, which the model indexes
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # -- multimodal rotary sections the model defaults to full-size values: they must fill the tiny
    #    rotary half (8; 4 where half the head rotates)
    "glm4v_text": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
    "glm_image_text": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
    "glm_ocr_text": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
    "glm4v_moe_text": {"rope_parameters": {"mrope_section": [2, 1, 1]}},
    "qwen2_vl_text": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
    "qwen2_5_vl_text": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
    "hunyuan_vl_text": {"rope_parameters": {"mrope_section": [2, 2, 2, 2]}},
    # -- defaults that cannot build a model
    # the attention module reads attn_config.rope_theta and clamps by clip_qkv; neither has a default
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # rope_parameters defaults to {}; the model reads one entry per layer type
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
    # no vocabulary by default (ESM takes a vocab_list): the special tokens must be given
    "esm": {"pad_token_id": 0, "mask_token_id": 3, "cls_token_id": 1},
    # adapters per language: the model refuses to run without a default language
    "xmod": {"default_language": "en_XX"},
    # -- sizes tied together in ways the field names do not say
    # axial position embeddings: widths sum to the model's, shape multiplies to the positions
    "reformer": {"axial_pos_embds_dim": [32, 32], "axial_pos_shape": [8, 16]},
    # spatial embeddings: 4 coordinates and 2 shapes concatenated fill the width (4 x 10 + 2 x 12)
    "layoutlmv3": {"coordinate_size": 10, "shape_size": 12},
    # layout embeddings of width / 6 each: a width divisible by 6 and by 4 heads
    "lilt": {"hidden_size": 48},
    # the convolutional stem always downsamples by 16
    "levit": {"patch_size": 16},
    # group norm over the (smaller) stem channels
    "bit": {"num_groups": 8},
}


def model_types() -> list[str]:
    """Every model type transformers can build a config for, sorted."""
    return sorted(configuration_auto.CONFIG_MAPPING_NAMES)


MAPPINGS = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
            "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "MODEL_MAPPING_NAMES")


def pick_class(model_type: str) -> str | None:
    """The most useful class name: causal LM, else seq2seq LM, else sequence classification, else base;
    seq2seq LM first for an encoder-decoder (its causal-LM class is the decoder alone: no encoder, no
    cross-attention)."""
    mappings = list(MAPPINGS)
    if _encoder_decoder(model_type):
        mappings.insert(0, mappings.pop(1))
    for name in mappings:
        cls = getattr(modeling_auto, name).get(model_type)
        if isinstance(cls, (list, tuple)):
            cls = cls[0]
        if cls:
            return cls
    return None


def _encoder_decoder(model_type: str) -> bool:
    try:
        return bool(configuration_auto.CONFIG_MAPPING[model_type]().is_encoder_decoder)
    except Exception:
        return False


def is_causal_lm(model_type: str) -> bool:
    return pick_class(model_type) == modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def model_class(model_type: str):
    import transformers

    name = pick_class(model_type)
    return getattr(transformers, name) if name else None


def sub_configs(config: PretrainedConfig) -> dict[str, PretrainedConfig]:
    return {k: v for k, v in vars(config).items() if isinstance(v, PretrainedConfig)}


def multimodal(config: PretrainedConfig) -> list[str]:
    """The names of sub-configs that are not text (vision, audio, ...): the model is not text-only."""
    return sorted(k for k in sub_configs(config) if k not in TEXT_SUBCONFIGS)


def default_config(model_type: str) -> PretrainedConfig:
    """The type's default config (with its override where the default itself is invalid)."""
    cls = configuration_auto.CONFIG_MAPPING[model_type]
    try:
        return cls()
    except Exception:
        if model_type not in OVERRIDES:
            raise
        return cls(**OVERRIDES[model_type])


def tiny_config(model_type: str) -> PretrainedConfig:
    """The type's default config shrunk by the generic rules (and its override, if any); with as many
    key/value heads as query heads for a family whose config refuses grouped-query attention."""
    try:
        return _tiny_config(model_type, gqa=True)
    except Exception as e:
        try:
            return _tiny_config(model_type, gqa=False)
        except Exception:
            raise e from None


def _tiny_config(model_type: str, gqa: bool) -> PretrainedConfig:
    cls = configuration_auto.CONFIG_MAPPING[model_type]
    default = default_config(model_type)
    changes = _shrink(default, gqa)
    fields = default.to_dict()
    for key, value in OVERRIDES.get(model_type, {}).items():
        if isinstance(value, dict) and key not in changes and isinstance(fields.get(key), dict):
            changes[key] = dict(fields[key])  # an override of some fields of a dict: start from the default
        _merge(changes, {key: value})
    try:
        config = cls(**changes)
    except TypeError:  # a config whose __init__ takes only some fields: set the rest after building
        config = copy.deepcopy(default)
        _assign(config, changes)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        pad = getattr(config, "pad_token_id", None)  # v5 keeps it in generation configs; generate needs one
        config.decoder_start_token_id = pad if _int(pad) else 0
    return config


def _merge(into: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _assign(config, changes: dict) -> None:
    for key, value in changes.items():
        current = getattr(config, key, None)
        if isinstance(current, PretrainedConfig) and isinstance(value, dict):
            _assign(current, value)
        else:
            setattr(config, key, value)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shrink(config, gqa: bool = True) -> dict:
    """{field: new value} for a config (a PretrainedConfig or a plain dict of fields), recursively for
    sub-configs and nested dicts; only fields that change."""
    fields = config.to_dict() if isinstance(config, PretrainedConfig) else dict(config)
    subs = sub_configs(config) if isinstance(config, PretrainedConfig) else {}
    out: dict = {}
    layers = next((fields[k] for k in LAYER_KEYS if _int(fields.get(k))), None)
    heads = next((fields[k] for k in HEAD_KEYS if _int(fields.get(k))), None)
    old_head_dim = fields.get("head_dim") if _int(fields.get("head_dim")) else None
    if old_head_dim is None and heads:
        width = next((fields[k] for k in WIDTH_KEYS if _int(fields.get(k))), None)
        old_head_dim = width // heads if width else None

    def small(key, value):
        if key in LAYER_KEYS:
            return min(value, len(keep) or LAYERS)
        if key in WIDTH_KEYS:
            return min(value, WIDTH)
        if key in HEAD_KEYS:  # 4 heads (1 stays 1): 64 / 3 heads would not divide
            return HEADS if value > 1 else value
        if key in KV_KEYS:  # multi-query stays multi-query; latent attention (MLA) has a key per query head
            return 1 if value == 1 else min(value, HEADS if "kv_lora_rank" in fields or not gqa else KV_HEADS)
        if key in HEAD_DIM_KEYS:
            return min(value, HEAD_DIM)
        if key in FFN_KEYS:
            return min(value, FFN)
        if key in EXPERT_KEYS:
            return min(value, EXPERTS)
        if key in TOP_K_KEYS:
            return min(value, TOP_K)
        if key == "embedding_size" and value in [fields.get(k) for k in WIDTH_KEYS]:
            return WIDTH  # embeddings as wide as the model stay so
        if key in SMALL:
            return min(value, SMALL[key])
        if key in POSITION_KEYS:
            return min(value, POSITIONS)
        if key in WINDOW_KEYS:
            return min(value, WINDOW)
        if key.endswith("vocab_size") or key.startswith("vocab_size_"):
            return min(value, VOCAB)
        if key.endswith(("_token_id", "_token_index")) and value >= VOCAB:
            return TOKENS.get(key, 3)
        if key == "image_size":
            return min(value, IMAGE)
        if key == "patch_size":
            return min(value, PATCH)
        if key in ("max_window_layers", "decoder_sparse_step", "moe_layer_freq"):
            return min(value, 1)
        if key.startswith("mamba_"):
            return value
        if key.endswith("heads") and "num" in key:  # other head counts (linear attention, indexers)
            return min(value, HEADS)
        if key.endswith("head_dim"):
            return min(value, HEAD_DIM)
        return value

    keep = _kept_layers(fields, layers)
    shared = fields.get("num_kv_shared_layers")
    if _int(shared) and shared > 0 and layers and layers > LAYERS:
        keep = keep * 2  # layers that reuse earlier layers' keys/values: the second half shares the first's
        out["num_kv_shared_layers"] = LAYERS
    for key, value in fields.items():
        if key in out:
            continue
        if key in subs:
            changed = _shrink(subs[key], gqa)
            if changed:
                out[key] = {**subs[key].to_dict(), **changed}
            continue
        if _int(value):
            new = small(key, value)
        elif value is None and key in ("head_dim", *KV_KEYS) and heads:
            new = HEAD_DIM if key == "head_dim" else KV_HEADS if gqa else HEADS  # unset: some models need it
        elif value is None and key in UNSET and (key == "vocab_size" or _int(fields.get("moe_intermediate_size"))):
            new = UNSET[key]  # unset in the default, which cannot build a model then
        elif isinstance(value, list) and key in STAGE_KEYS and value and all(_int(v) for v in value):
            stages = [value[i] for i in keep] if layers and len(value) == layers > LAYERS else value
            new = [min(v, 1) if key == "depths" else min(v, WIDTH) if key in STAGE_KEYS[:2] else HEADS
                   for v in stages]  # per-stage lists of hierarchical vision models
        elif isinstance(value, list) and layers and len(value) == layers and layers > LAYERS:
            new = [small(key, value[i]) if _int(value[i]) else value[i] for i in keep]  # one entry per layer
        elif isinstance(value, list) and layers and key.endswith(LAYER_LISTS) and all(_int(v) for v in value):
            new = [keep.index(v) for v in value if v in keep]  # indices of layers: those kept, renumbered
            if not new and value and ("attn" in key or "attention" in key):
                new = [LAYERS - 1]  # the layers that have attention: keep one
        elif isinstance(value, list) and key.endswith("token_id"):
            new = [v for v in value if _int(v) and v < VOCAB] or [TOKENS.get(key, 2)]
        elif isinstance(value, list) and key in ("image_size", "patch_size") and all(_int(v) for v in value):
            new = [min(v, IMAGE if key == "image_size" else PATCH) for v in value]
        elif isinstance(value, dict) and key in ("rope_parameters", "rope_scaling"):
            new = _rope(value)
        elif isinstance(value, dict) and "layer" in key and layers and value and all(str(k).isdigit() for k in value):
            new = {str(j).zfill(len(str(k))): _per_layer(v, old_head_dim, gqa)
                   for j, i in enumerate(keep) for k, v in value.items() if int(k) == i}  # {layer index: fields}
        elif isinstance(value, dict) and "layer" in key and value and set(value) <= set(fields.get("layer_types") or []):
            new = {k: _per_layer(v, old_head_dim, gqa) for k, v in value.items()}  # {layer kind: fields}
        elif isinstance(value, dict) and key in ("attn_config", "ffn_config"):
            new = {**value, **_shrink(value, gqa)}
        else:
            continue
        if new != value:
            out[key] = new
    kinds, types = fields.get("attention_layers"), fields.get("attention_types")
    if isinstance(kinds, list) and isinstance(types, list) and len(kinds) == layers and keep:  # GPT-Neo before 5.2x
        out["attention_types"] = [[[kinds[i] for i in keep], 1]]  # its attention_layers is rebuilt from this
    rope = fields.get("qk_rope_head_dim")
    if _int(rope) and _int(fields.get("head_dim")):  # latent attention (MLA): head_dim is the rotary part or all
        out["head_dim"] = SMALL["qk_rope_head_dim"] if fields["head_dim"] == rope else SMALL["qk_head_dim"]
    kinds = out.get("layer_types")
    if isinstance(kinds, list) and kinds and set(kinds) == {"linear_attention"}:
        out["layer_types"] = kinds[:-1] + ["full_attention"]  # a hybrid with no attention layer by default
    if _int(fields.get("expand")) and _int(fields.get("state_size")) and _int(out.get("num_heads")):
        out["head_dim"] = fields["expand"] * WIDTH // out["num_heads"]  # state-space heads fill the inner width
    if _int(fields.get("mamba_n_heads")):  # state-space layers of a hybrid: heads x head size = inner width
        inner = min(fields.get("mamba_d_ssm") or 2 * WIDTH, (fields.get("mamba_expand") or 2) * WIDTH)
        out.update(mamba_n_heads=HEADS, mamba_d_head=inner // HEADS, mamba_d_state=16, mamba_chunk_size=16)
        if _int(fields.get("mamba_d_ssm")):
            out["mamba_d_ssm"] = inner
    return out


def _kept_layers(fields: dict, layers: int | None) -> list[int]:
    """Which of the default layers the tiny config keeps: the first, then the first of each layer kind
    (layer_types) that would otherwise be lost, ``LAYERS`` in all."""
    if not layers or layers <= LAYERS:
        return list(range(layers or 0))
    kinds = next((fields[k] for k in KIND_KEYS if isinstance(fields.get(k), list)), None)
    keep = [0]
    if isinstance(kinds, list) and len(kinds) == layers:
        for i, kind in enumerate(kinds):
            if len(keep) < LAYERS and kind not in [kinds[j] for j in keep]:
                keep.append(i)
    for i in range(layers):
        if len(keep) < LAYERS and i not in keep:
            keep.append(i)
    return sorted(keep)


def _per_layer(value, old_head_dim, gqa):
    """A layer's (or layer kind's) own fields, shrunk; head sizes scaled like the global one (keeps e.g.
    a layer's double head_dim)."""
    if not isinstance(value, dict):
        return value
    out = {**value, **_shrink(value, gqa)}
    for key in ("head_dim", "global_head_dim"):
        if _int(value.get(key)) and old_head_dim and not _int(value.get("qk_rope_head_dim")):
            out[key] = max(2, HEAD_DIM * value[key] // old_head_dim)
    return out


def _rope(params: dict) -> dict:
    """Rotary parameters: per-dimension lists resized to the tiny head size, positions capped."""
    if params and all(isinstance(v, dict) for v in params.values()):  # {layer kind: parameters}
        return {k: _rope(v) for k, v in params.items()}
    out = dict(params)
    if _int(out.get("original_max_position_embeddings")):
        out["original_max_position_embeddings"] = min(out["original_max_position_embeddings"], POSITIONS // 2)
    factor = out.get("partial_rotary_factor", 1.0) or 1.0
    half = max(1, int(HEAD_DIM * factor) // 2)
    for key in ("short_factor", "long_factor"):
        if isinstance(out.get(key), list):
            out[key] = (out[key] + [1.0] * half)[:half]
    if isinstance(out.get("mrope_section"), list) and out["mrope_section"]:
        old = out["mrope_section"]
        new = [max(1, v * half // sum(old)) for v in old]
        new[0] += half - sum(new)
        out["mrope_section"] = new
    return out
