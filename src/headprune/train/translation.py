"""Training a small Marian encoder-decoder from scratch, and greedy translation; see the `headprune.train` doc."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, MarianConfig, MarianMTModel

from ..errors import ConfigError, DataError
from ..evaluation.batching import length_buckets, pad_rows
from ..evaluation.translation import generate_translations, generation_protocol
from ..provenance import versions
from .batching import epoch_seed
from .checkpoint import data_fingerprint, find_resume, prepare_dir, settings_json
from .checks import check_stop, check_texts
from .job import Job
from .loop import TrainResult, fit
from .settings import TranslationTrainSettings
from .tokenizer import train_tokenizer

IGNORE = -100  # label id that cross_entropy skips (padding)
def build_translation_model(settings: TranslationTrainSettings, tokenizer: Any) -> MarianMTModel:
    """A randomly initialised Marian model sized by `settings`, with the tokenizer's special ids.

    Embeddings are shared by encoder, decoder and output layer (joint vocabulary); decoding starts
    from `<s>` (the pad token when the tokenizer has no bos). Draw it after `torch.manual_seed`.
    """
    s, t = settings, tokenizer
    if t.pad_token_id is None or t.eos_token_id is None:
        raise ConfigError("tokenizer must have pad and eos tokens, got "
                          f"pad_token_id={t.pad_token_id!r}, eos_token_id={t.eos_token_id!r}")
    start = t.bos_token_id if t.bos_token_id is not None else t.pad_token_id
    cfg = MarianConfig(
        vocab_size=len(t), decoder_vocab_size=len(t), d_model=s.d_model,
        encoder_layers=s.encoder_layers, decoder_layers=s.decoder_layers,
        encoder_attention_heads=s.attention_heads, decoder_attention_heads=s.attention_heads,
        encoder_ffn_dim=s.ffn_dim, decoder_ffn_dim=s.ffn_dim, activation_function=s.activation,
        dropout=s.dropout, attention_dropout=s.attention_dropout, activation_dropout=s.activation_dropout,
        max_position_embeddings=max(512, 2 * s.max_length), scale_embedding=True,
        pad_token_id=t.pad_token_id, eos_token_id=t.eos_token_id, bos_token_id=start,
        decoder_start_token_id=start, forced_eos_token_id=t.eos_token_id,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )
    model = MarianMTModel(cfg)
    _freeze_positions(model)
    gc = model.generation_config  # what a plain generate() on a saved checkpoint does: greedy, bounded
    gc.num_beams, gc.do_sample, gc.max_new_tokens = 1, False, s.max_length
    return model


def _freeze_positions(model: Any) -> None:
    """Keep Marian's sinusoidal position tables fixed. `from_pretrained` (5.23) hands them back with
    requires_grad=True, and `save_pretrained` does not save them: trained, they would be lost."""
    for name, p in model.named_parameters():
        if name.endswith("embed_positions.weight"):
            p.requires_grad_(False)


def _encode_eos(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids + `</s>`, whatever the tokenizer's own post-processing does."""
    eos = tokenizer.eos_token_id
    return [ids + [eos] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def translate(model: Any, tokenizer: Any, sources: list[str], *, max_length: int = 128,
              batch_size: int = 64, num_beams: int = 1) -> list[str]:
    """Translations of `sources` (truncated to `max_length` tokens), in the input order, by headprune's one
    BLEU protocol (:func:`headprune.evaluation.translation.generate_translations`)."""
    ids = [x[:max_length - 1] + [tokenizer.eos_token_id] if len(x) > max_length else x
           for x in _encode_eos(tokenizer, sources)]
    return generate_translations(model, tokenizer, ids, num_beams=num_beams, batch_size=batch_size)[0]


def train_translation(
    sources: list[str],
    targets: list[str],
    *,
    settings: TranslationTrainSettings,
    output_dir: str | Path,
    tokenizer: Any | None = None,
    eval_sources: list[str] | None = None,
    eval_targets: list[str] | None = None,
    stop_after_epoch: int | None = None,
) -> TrainResult:
    """Train a Marian encoder-decoder from scratch on (source, target) pairs; see the module doc.

    Without `tokenizer`, a joint tokenizer of `settings.vocab_size` is trained on sources + targets
    and saved to `output_dir/tokenizer` (a rerun that resumes uses the checkpoint's). Loss: label-smoothed cross-entropy per
    target token. With eval data, each epoch logs `eval_nll` (per token, no smoothing) and
    detokenised sacreBLEU of greedy translations (`eval_bleu`, `bleu_signature`).
    """
    s = settings
    if not isinstance(s, TranslationTrainSettings):
        raise ConfigError(f"settings must be a TranslationTrainSettings, got {type(s).__name__}")
    check_stop(stop_after_epoch)
    sources, targets = _checked_pairs("sources", "targets", sources, targets)
    has_eval = eval_sources is not None or eval_targets is not None
    if has_eval:
        if eval_sources is None or eval_targets is None:
            raise DataError("eval_sources and eval_targets must be given together")
        eval_sources, eval_targets = _checked_pairs("eval_sources", "eval_targets", eval_sources, eval_targets)

    out = prepare_dir(output_dir)
    fingerprint = data_fingerprint(sources, targets)
    resume = find_resume(out, "translation", s, fingerprint)
    if tokenizer is None and resume is not None:  # the one the checkpoint was trained with
        tokenizer = AutoTokenizer.from_pretrained(str(out / f"epoch-{resume[0]}"), local_files_only=True)
    elif tokenizer is None:
        tokenizer = train_tokenizer(sources + targets, s.vocab_size, out / "tokenizer", kind=s.tokenizer_kind)
    src_ids, tgt_ids = _encode_eos(tokenizer, sources), _encode_eos(tokenizer, targets)
    keep = [i for i in range(len(sources)) if max(len(src_ids[i]), len(tgt_ids[i])) <= s.max_length]
    if not keep:
        raise DataError(f"every training pair is longer than settings.max_length={s.max_length} tokens")
    src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
    pad = tokenizer.pad_token_id

    torch.manual_seed(s.seed)
    if resume is not None:
        model = MarianMTModel.from_pretrained(str(out / f"epoch-{resume[0]}"), local_files_only=True)
        _freeze_positions(model)
    else:
        model = build_translation_model(s, tokenizer)
    start = model.config.decoder_start_token_id

    def collate(src: list[list[int]], tgt: list[list[int]]) -> dict[str, torch.Tensor]:
        x = pad_rows(src, pad)  # [B, S]
        return {"input_ids": x, "attention_mask": (x != pad).long(),
                "decoder_input_ids": pad_rows([[start] + t[:-1] for t in tgt], pad),  # [B, T], teacher forcing
                "labels": pad_rows(tgt, IGNORE)}  # [B, T]

    lengths = [max(len(a), len(b)) for a, b in zip(src_ids, tgt_ids, strict=True)]

    def batches(epoch: int) -> list[list[int]]:
        return length_buckets(lengths, rng=random.Random(epoch_seed(s.seed, epoch)),
                                       sort_chunk=s.sort_chunk, batch_size=s.batch_size, max_tokens=s.max_tokens)

    def lr_factor(n: int) -> float:  # linear warm-up, then inverse square root
        return n / s.warmup_steps if n <= s.warmup_steps else math.sqrt(s.warmup_steps / n)

    def loss(m: Any, idx: list[int]) -> tuple[torch.Tensor, int, int]:
        mean, n_tokens = _forward_loss(m, collate([src_ids[i] for i in idx], [tgt_ids[i] for i in idx]),
                                      s.label_smoothing)
        return mean, n_tokens, len(idx)

    evaluate = _bleu_evaluator(tokenizer, s, eval_sources, eval_targets, collate) if has_eval else None
    info = {"task": "translation", "architecture": "MarianMTModel", "n_pairs": len(sources),
            "n_train": len(keep), "n_skipped_too_long": len(sources) - len(keep),
            "n_eval": len(eval_sources) if has_eval else 0, "vocab_size": len(tokenizer),
            "n_parameters": sum(p.numel() for p in model.parameters()), "settings": settings_json(s),
            "data_sha256": fingerprint, "versions": versions()}
    return fit(Job("translation", model, tokenizer, s, out, info, resume, batches, loss, lr_factor,
                     evaluate, stop_after_epoch))


def _checked_pairs(name: str, name2: str, sources: Any, targets: Any) -> tuple[list[str], list[str]]:
    """``sources`` and ``targets`` as lists of strings of one length, at least one pair."""
    sources = check_texts(name, sources)
    targets = check_texts(name2, targets, len(sources))
    if not sources:
        raise DataError(f"{name} must hold at least one pair, got 0")
    return sources, targets


def _forward_loss(m: Any, batch: dict[str, torch.Tensor], smoothing: float) -> tuple[torch.Tensor, int]:
    """(label-smoothed cross-entropy per target token, number of target tokens) of ``batch`` (its labels popped)."""
    labels = batch.pop("labels")
    logits = m(**batch).logits  # [B, T, V]
    total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE,
                            label_smoothing=smoothing, reduction="sum")
    n_tokens = int((labels != IGNORE).sum())
    return total / n_tokens, n_tokens


def _bleu_evaluator(tokenizer: Any, s: TranslationTrainSettings, eval_sources: list[str], eval_targets: list[str],
                    collate: Callable) -> Callable[[Any], dict]:
    """``evaluate(model)``: ``eval_nll`` per token (no smoothing) and detokenised sacreBLEU of greedy translations."""
    import sacrebleu

    ev_src = [x[:s.max_length - 1] + [tokenizer.eos_token_id] if len(x) > s.max_length else x
              for x in _encode_eos(tokenizer, eval_sources)]
    ev_tgt = [x[:s.max_length] for x in _encode_eos(tokenizer, eval_targets)]

    @torch.no_grad()
    def evaluate(m: Any) -> dict:
        m.eval()
        nll, n_tok = 0.0, 0
        for st in range(0, len(ev_src), s.eval_batch_size):
            sl = slice(st, st + s.eval_batch_size)
            mean, n = _forward_loss(m, collate(ev_src[sl], ev_tgt[sl]), 0.0)
            nll, n_tok = nll + mean.item() * n, n_tok + n
        hyps = translate(m, tokenizer, eval_sources, max_length=s.max_length, batch_size=s.eval_batch_size)
        bleu = sacrebleu.metrics.BLEU()
        score = bleu.corpus_score(hyps, [eval_targets])
        return {"eval_nll": nll / n_tok, "eval_bleu": round(score.score, 2), "eval_bleu_exact": score.score,
                "bleu_signature": str(bleu.get_signature()), "eval_n": len(eval_sources),
                "generation": generation_protocol(1)}

    return evaluate
