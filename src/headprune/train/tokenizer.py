"""Train a joint subword tokenizer for a translation model trained from scratch.

One vocabulary for both languages (the embeddings of encoder, decoder and output layer are shared),
SentencePiece-style pre-tokenisation (a space becomes `▁`, so decoding restores the exact spacing and
detokenised BLEU needs no language-specific detokeniser), and `</s>` appended to every sequence:
Marian's convention for both the source and the labels.

The result is an ordinary `PreTrainedTokenizerFast`: `save_pretrained` writes `tokenizer.json` +
`tokenizer_config.json`, and `AutoTokenizer.from_pretrained(dir)` loads it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from ..errors import ConfigError, DataError

# Fixed ids: the model config and the tokenizer must agree, and fixed ids make that checkable.
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)  # ids 0, 1, 2, 3
TOKENIZER_KINDS = ("bpe", "unigram")


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    output_dir: str | Path | None = None,
    *,
    kind: Literal["bpe", "unigram"] = "bpe",
    min_frequency: int = 2,
    max_length: int = 1024,
) -> PreTrainedTokenizerFast:
    """Learn a subword vocabulary of at most `vocab_size` entries (specials included) from `texts`.

    `texts` should hold both languages (sources and targets) for a joint vocabulary. Text is NFKC-
    normalised and case is kept. `max_length` becomes `model_max_length`. Saved to `output_dir`
    (created) when given. The vocabulary can come out smaller than `vocab_size` on a small corpus.
    """
    if kind not in TOKENIZER_KINDS:
        raise ConfigError(f"kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
    if not isinstance(vocab_size, int) or vocab_size <= len(SPECIAL_TOKENS):
        raise ConfigError(f"vocab_size must be an int > {len(SPECIAL_TOKENS)} (the special tokens), got {vocab_size!r}")
    if not isinstance(min_frequency, int) or min_frequency < 1:
        raise ConfigError(f"min_frequency must be an int >= 1, got {min_frequency!r}")
    if not isinstance(max_length, int) or max_length < 2:
        raise ConfigError(f"max_length must be an int >= 2, got {max_length!r}")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise DataError(f"texts[{i}] must be a str, got {type(text).__name__}")
    if not any(t.strip() for t in texts):
        raise DataError(f"texts must hold at least one non-empty string, got {len(texts)} empty ones")

    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=UNK))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
    else:
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), unk_token=UNK, show_progress=False,
        )
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):  # the trainers put the specials first, in order
        if tok.token_to_id(token) != i:
            raise DataError(f"special token {token!r} got id {tok.token_to_id(token)}, expected {i}")
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, SPECIAL_TOKENS.index(EOS))],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, unk_token=UNK, bos_token=BOS, eos_token=EOS,
        model_max_length=max_length,
    )
    if output_dir is not None:
        fast.save_pretrained(str(output_dir))
    return fast
