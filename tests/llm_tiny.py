"""A tiny random decoder with a real byte-level BPE tokenizer, pruned unevenly (for the GGUF and lm-eval tests)."""

from __future__ import annotations

import torch
import transformers

import headprune

TEXTS = ["The quick brown fox jumps over the lazy dog, and the dog does not mind at all.",
         "Attention heads that a trained model does not need can be removed before it ships.",
         "Pruned models run faster on the machines where people use them, and keep their quality."]


def bpe_tokenizer(vocab_size: int = 300):
    """A byte-level BPE (the GPT-2/Llama-3/SmolLM kind) trained on a few sentences; id 0 is <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXTS * 4, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>", pad_token="<|endoftext|>")


def tiny_decoder(family: str = "llama", *, layers: int = 3, seed: int = 0, tied: bool = False):
    """A random ``family`` causal LM: hidden 64, 4 query heads over 2 key/value heads (head_dim 16), FFN 128."""
    torch.manual_seed(seed)
    config = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
              "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
              "gemma": transformers.GemmaConfig}[family](
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=tied,
        rms_norm_eps=1e-5, **({"sliding_window": None} if family == "mistral" else {}))
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # larger than init so that logits differ clearly between tokens
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(4.0)
    return model


def prune_unevenly(model) -> None:
    """Different query/key-value heads and FFN widths per layer, the same group size inside each layer
    (what ``--gqa uniform`` keeps): layer 0 loses one query head per group (4/2 -> 2/2), layer 1 a whole
    group (4/2 -> 2/1), layer 2 keeps its heads; FFN widths 96, 128, 64 (multiples of 32, Q8_0's block)."""
    sites = [s.name for s in headprune.find_sites(model)]
    ffns = [f.name for f in headprune.find_ffns(model)]
    headprune.prune_heads(model, {sites[0]: [0, 2], sites[1]: [0, 1]})
    headprune.prune_neurons(model, {ffns[0]: list(range(0, 64, 2)), ffns[2]: list(range(1, 128, 2))})
