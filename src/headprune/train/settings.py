"""The settings of the two training tasks: plain dataclasses, checked when built, light to import (the
CLI reads their defaults for its flags without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError
from .checks import check_common, check_fractions, check_ints, check_setting


@dataclass
class ClassifierTrainSettings:
    """Fine-tuning a pretrained encoder: AdamW, linear warm-up then linear decay to zero."""

    epochs: int = 3
    batch_size: int = 32
    lr: float = 2e-5
    warmup_ratio: float = 0.1  # fraction of all steps spent warming up linearly from 0
    weight_decay: float = 0.01  # not applied to biases and LayerNorm weights (1-D parameters)
    max_grad_norm: float | None = 1.0  # clip the global gradient norm; None: no clipping
    max_length: int = 128  # tokens per example (pair) after truncation, specials included
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    seed: int = 0
    sort_chunk: int = 1024  # sort by length within random chunks of this many examples (1: no sorting)
    eval_batch_size: int = 64
    progress: bool = True  # on stderr: bars on a terminal, else plain lines (headprune.progress)

    def __post_init__(self) -> None:
        check_common(self)
        check_ints(self, ("batch_size",), 1)
        check_fractions(self, ("warmup_ratio",), one_ok=True)


ACTIVATIONS = ("relu", "gelu", "swish", "silu")


@dataclass
class TranslationTrainSettings:
    """A Marian-shaped (post-LN Transformer) encoder-decoder trained from scratch.

    Defaults are a small model for CPUs (3+3 layers, d_model 256, 4 heads); `iwslt()` gives the
    paper's IWSLT shape. AdamW with linear warm-up then inverse-square-root decay.
    """

    epochs: int = 10
    batch_size: int | None = 64  # examples per batch; exactly one of batch_size and max_tokens is set
    max_tokens: int | None = None  # padded tokens per batch: n * max(source, target length) <= max_tokens
    lr: float = 7e-4  # peak learning rate, reached at the end of the warm-up
    warmup_steps: int = 1000
    weight_decay: float = 1e-4
    max_grad_norm: float | None = 1.0
    label_smoothing: float = 0.1
    max_length: int = 128  # tokens incl. </s>; longer training pairs are skipped, eval sources truncated;
    # BLEU is decoded by headprune's one protocol (evaluation.translation.generate_translations), greedy
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    vocab_size: int = 8000  # joint source+target vocabulary when the tokenizer is trained here
    tokenizer_kind: Literal["bpe", "unigram"] = "bpe"
    encoder_layers: int = 3
    decoder_layers: int = 3
    d_model: int = 256
    attention_heads: int = 4  # per attention site (encoder self, decoder self, cross)
    ffn_dim: int = 1024
    activation: str = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    seed: int = 0
    sort_chunk: int = 4096
    eval_batch_size: int = 64
    progress: bool = True

    @classmethod
    def iwslt(cls, **overrides: Any) -> TranslationTrainSettings:
        """Section 6's IWSLT model: 6+6 layers, 8 heads, d_model 512, FFN 1024 (fairseq's
        `transformer_iwslt_de_en` sizes), dropout 0.3, 4096 tokens per batch, 4000 warm-up steps."""
        shape = dict(encoder_layers=6, decoder_layers=6, d_model=512, attention_heads=8, ffn_dim=1024,
                     dropout=0.3, batch_size=None, max_tokens=4096, lr=5e-4, warmup_steps=4000,
                     vocab_size=10000)
        return cls(**{**shape, **overrides})

    def __post_init__(self) -> None:
        check_common(self)
        check_ints(self, ("batch_size", "max_tokens"), 1, none_ok=True)
        if (self.batch_size is None) == (self.max_tokens is None):
            raise ConfigError("TranslationTrainSettings: set exactly one of batch_size and max_tokens, "
                              f"got batch_size={self.batch_size!r}, max_tokens={self.max_tokens!r}")
        if self.max_tokens is not None:
            check_setting(self, "max_tokens", self.max_tokens >= self.max_length,
                   f"an int >= max_length ({self.max_length})")
        check_ints(self, ("warmup_steps", "encoder_layers", "decoder_layers", "d_model", "attention_heads"), 1)
        check_ints(self, ("ffn_dim",), 1)
        check_setting(self, "d_model", self.d_model % self.attention_heads == 0,
               f"a multiple of attention_heads ({self.attention_heads})")
        check_ints(self, ("vocab_size",), 8)
        check_setting(self, "tokenizer_kind", self.tokenizer_kind in ("bpe", "unigram"), "'bpe' or 'unigram'")
        check_setting(self, "activation", self.activation in ACTIVATIONS, f"one of {ACTIVATIONS}")
        check_fractions(self, ("label_smoothing", "dropout", "attention_dropout", "activation_dropout"))
