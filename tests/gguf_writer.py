"""Write a tiny random Llama as a GGUF file the way llama.cpp's converter lays it out (for tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary layout of q/k rows (transformers' GGUF reader undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model, path: Path) -> Path:
    """``model`` (a LlamaForCausalLM) as float32 GGUF with a small byte-level vocabulary in its metadata."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_embedding_length(c.hidden_size)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    tokens = ["<pad>", "<s>", "</s>"] + [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(c.vocab_size - 3)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, c.num_hidden_layers)
    for key, value in model.state_dict().items():
        a = value.float().numpy()
        if key.endswith("q_proj.weight"):
            a = _permute(a, c.num_attention_heads)
        elif key.endswith("k_proj.weight"):
            a = _permute(a, c.num_key_value_heads)
        w.add_tensor(names.get_name(key.removesuffix(".weight")) + ".weight", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
