"""Translation with an encoder-decoder: detokenised corpus BLEU (sacrebleu) of generated translations.

One generation protocol for every BLEU headprune reports (training-time evaluation, ``evaluate``,
the studies): :func:`generate_translations`. Each sentence may generate at most
``min(ceil(1.5 * its source length) + 10, 256)`` new tokens (and fewer than the decoder's position
table), greedy or beam search with ``num_beams``, decoded with ``skip_special_tokens=True``.
Sentences are batched only with sources of exactly the same length, so no batch holds padding and
every sentence's bound is its own: the batch size does not change the translations. ``per_example`` holds the
sentence-level BLEU sufficient statistics, so a paired bootstrap can resample corpus BLEU exactly
(:func:`bleu_from_stats` turns summed statistics back into BLEU).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..checks import check_int
from ..core.model.chunked import token_outputs
from ..core.model.devices import input_device, to_device
from ..core.model.finite import check_finite_weights
from ..distributed import gather, reduce_arrays, shard, spread
from ..errors import ConfigError, DataError
from ..extras import require
from ..progress import progress_bar
from ..provenance import portable_path
from .base import EvalResult, check_strings, check_trained, check_unbatched, mask_context
from .batching import Batches, length_buckets, pad_rows
from .data import ParallelData, check_limit
from .metrics import bleu_statistics

MAX_NEW_TOKENS = 256  # cap of the default bound 1.5 * source length + 10


def generation_protocol(num_beams: int = 1, max_new_tokens: int | None = None) -> str:
    """The generation settings in words, for results (beside sacreBLEU's signature)."""
    bound = max_new_tokens if max_new_tokens is not None else f"min(ceil(1.5*src)+10,{MAX_NEW_TOKENS})"
    return f"beams:{num_beams}|max_new_tokens:{bound} per sentence|batches:equal source length"


class Translation:
    """Source sentences and one reference translation each; a sentence pair is one example.

    ``data``: a :class:`headprune.evaluation.data.ParallelData` or ``(sources, targets)``. ``max_new_tokens``
    None bounds each batch by ``min(1.5 * longest source + 10, 256)`` tokens, and always by the
    decoder's position table. ``tokenize`` is sacrebleu's tokeniser ('13a', 'intl', 'zh', ...).

    ``evaluate``: score = BLEU; ``extra``: ``chrf``, ``sacrebleu`` (BLEU signature), ``hypotheses``
    (data order); ``per_example["bleu_stats"]`` [n, 10] (columns :data:`BLEU_STATS`).
    ``loss``: teacher-forced mean token NLL of the references (``per_example``: ``nll_sum``, ``tokens``).
    """

    metric = "bleu"
    uses_generate = True  # decoder blocks run once per generated token: no decoder prefix replay
    higher_is_better = True

    def __init__(self, tokenizer, data: ParallelData | Sequence, *, batch_size: int = 32, num_beams: int = 1,
                 max_new_tokens: int | None = None, max_source_length: int = 256, max_target_length: int = 256,
                 tokenize: str = "13a"):
        check_int("batch_size", batch_size, 1)
        check_int("num_beams", num_beams, 1)
        check_int("max_source_length", max_source_length, 1)
        check_int("max_target_length", max_target_length, 1)
        if max_new_tokens is not None:
            check_int("max_new_tokens", max_new_tokens, 1)
        BLEU = require("sacrebleu.metrics", "translation (BLEU)").BLEU

        if tokenize not in BLEU.TOKENIZERS:
            raise ConfigError(f"tokenize={tokenize!r}; allowed: {', '.join(sorted(BLEU.TOKENIZERS))}")
        sources, targets, source = _unpack(data)
        if getattr(tokenizer, "pad_token_id", None) is None:
            raise ConfigError("tokenizer has no pad token (pad_token_id=None); allowed: a tokenizer with one")
        self.tokenizer, self.pad_id = tokenizer, int(tokenizer.pad_token_id)
        self.sources, self.targets = sources, targets
        self.source_ids = tokenizer(sources, truncation=True, max_length=max_source_length)["input_ids"]
        self.target_ids = tokenizer(text_target=targets, truncation=True, max_length=max_target_length)["input_ids"]
        for name, rows in (("sources", self.source_ids), ("targets", self.target_ids)):
            empty = next((i for i, r in enumerate(rows) if not r), None)
            if empty is not None:
                raise DataError(f"{name}[{empty}] = {[sources, targets][name == 'targets'][empty]!r:.40} has no "
                                "tokens; allowed: text the tokenizer turns into at least one token")
        self.batch_size, self.num_beams, self.max_new_tokens, self.tokenize = (
            batch_size, num_beams, max_new_tokens, tokenize)
        rule = max_new_tokens if max_new_tokens is not None else f"min(ceil(1.5*src)+10,{MAX_NEW_TOKENS})"
        self.signature = {"task": "translation", "data": portable_path(source), "n": len(sources), "num_beams": num_beams,
                          "max_new_tokens": rule, "generation": generation_protocol(num_beams, max_new_tokens), "max_source_length": max_source_length,
                          "batch_size": batch_size, "tokenize": tokenize}

    def __len__(self) -> int:
        return len(self.sources)

    def references(self, *, limit: int | None = None) -> list[str]:
        """The reference translations scored by ``evaluate(limit=limit)`` (data order)."""
        check_limit(limit)
        return self.targets[:limit]

    def _buckets(self, limit: int | None) -> list[list[int]]:
        check_limit(limit)
        n = len(self) if limit is None else min(limit, len(self))
        return length_buckets([len(r) for r in self.source_ids[:n]], batch_size=self.batch_size)

    def _sources(self, idx: list[int]) -> dict[str, torch.Tensor]:
        rows = [self.source_ids[i] for i in idx]
        x = pad_rows(rows, self.pad_id)  # [B, S], right-padded: encoder positions start at 0
        return {"input_ids": x, "attention_mask": pad_rows([[1] * len(r) for r in rows], 0)}

    def batches(self, *, limit: int | None = None) -> Batches:
        """``input_ids``, ``attention_mask`` and ``labels`` (references, padded with -100), for importance;
        ``len`` is their count."""
        buckets = self._buckets(limit)
        return Batches(({**self._sources(idx), "labels": pad_rows([self.target_ids[i] for i in idx], -100)}
                        for idx in buckets), len(buckets))


    @torch.no_grad()
    def evaluate(self, model, mask: Mapping[str, torch.Tensor] | None = None, *, progress: bool = False,
                 limit: int | None = None) -> EvalResult:
        metrics = require("sacrebleu.metrics", "translation (BLEU)")
        BLEU, CHRF = metrics.BLEU, metrics.CHRF

        _check(model, mask, "Translation.evaluate")
        check_trained(model, "Translation.evaluate")
        check_finite_weights(model)  # generate turns NaN into plausible-looking tokens
        check_limit(limit)
        n = len(self) if limit is None else min(limit, len(self))
        start = time.perf_counter()
        with mask_context(model, mask):
            hyps, tokens = generate_translations(model, self.tokenizer, self.source_ids[:n], num_beams=self.num_beams,
                                                 max_new_tokens=self.max_new_tokens, batch_size=self.batch_size,
                                                 progress=progress)
        seconds = time.perf_counter() - start
        refs = self.targets[:n]
        bleu = BLEU(tokenize=self.tokenize)
        corpus = bleu.corpus_score(hyps, [refs])
        stats, _ = bleu_statistics(hyps, refs, tokenize=self.tokenize)
        extra = {"chrf": CHRF().corpus_score(hyps, [refs]).score, "sacrebleu": bleu.get_signature().format(),
                 "bp": corpus.bp, "sys_len": corpus.sys_len, "ref_len": corpus.ref_len, "hypotheses": hyps,
                 "signature": {**self.signature, "n": n}}
        return EvalResult(metric="bleu", score=float(corpus.score), n=n, per_example={"bleu_stats": stats},
                          extra=extra, seconds=seconds, tokens=tokens)

    @torch.no_grad()
    def loss(self, model, mask: Mapping[str, torch.Tensor] | None = None, *, progress: bool = False,
             limit: int | None = None) -> EvalResult:
        """Teacher-forced NLL of the references: score = mean NLL per target token (lower is better)."""
        _check(model, mask, "Translation.loss")
        buckets = self._buckets(limit)
        n = sum(len(b) for b in buckets)
        nll, count = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64)
        start = time.perf_counter()
        with mask_context(model, mask):
            for idx, batch in progress_bar(list(shard(zip(buckets, self.batches(limit=limit), strict=True))),
                                          desc="nll", unit="batch", show=progress):
                batch = to_device(batch, input_device(model))
                labels = batch["labels"]
                token = token_outputs(model, batch).token_nll(labels)  # [B, T], 0 where not scored; chunk by chunk
                labels = labels.to(token.device)
                nll[idx] = token.sum(-1).double().cpu().numpy()
                count[idx] = (labels != -100).sum(-1).cpu().numpy()
        nll, count = reduce_arrays(nll, count)  # under torchrun: each rank's examples
        seconds = time.perf_counter() - start
        return EvalResult(metric="nll", score=float(nll.sum() / count.sum()), n=n,
                          per_example={"nll_sum": nll, "tokens": count}, higher_is_better=False,
                          extra={"signature": {**self.signature, "n": n, "objective": "teacher-forced nll"}},
                          seconds=seconds, tokens=int(count.sum()))


def new_token_bound(model, source_length: int, max_new_tokens: int | None = None) -> int:
    """Most new tokens for one sentence: ``max_new_tokens``, else min(ceil(1.5 * source_length) + 10, 256);
    always below the decoder's position table."""
    bound = max_new_tokens or min(math.ceil(1.5 * source_length) + 10, MAX_NEW_TOKENS)
    positions = getattr(model.config, "max_position_embeddings", None)
    return min(bound, positions - 1) if positions else bound


def equal_length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices in batches of at most ``batch_size`` sources of one length, longest first, ties by index."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if batches and len(batches[-1]) < batch_size and lengths[batches[-1][0]] == lengths[i]:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@torch.no_grad()
def generate_translations(model, tokenizer, source_ids: Sequence[Sequence[int]], *, num_beams: int = 1,
                          max_new_tokens: int | None = None, batch_size: int = 32,
                          progress: bool = False) -> tuple[list[str], int]:
    """headprune's one BLEU generation protocol: (translations in input order, tokens processed).

    ``source_ids``: token ids of each source (with the tokenizer's special tokens). Batches hold
    sources of one length (no padding), each bounded by :func:`new_token_bound`.
    """
    model.eval()
    pad_id = int(tokenizer.pad_token_id)
    hyps: list[str] = [""] * len(source_ids)
    tokens = 0
    batches = list(shard(equal_length_batches([len(r) for r in source_ids], batch_size)))  # this rank's
    for idx in progress_bar(batches, desc="translate", unit="batch", show=progress):
        x = torch.tensor([list(source_ids[i]) for i in idx], device=input_device(model))  # [B, S], one length
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), num_beams=num_beams, do_sample=False,
                             num_return_sequences=1, max_new_tokens=new_token_bound(model, x.shape[1], max_new_tokens))
        for i, text in zip(idx, tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
            hyps[i] = text.strip()
        tokens += x.numel() + int((out[:, 1:] != pad_id).sum())
    if spread():  # under torchrun: every rank's translations
        parts = gather(({i: hyps[i] for idx in batches for i in idx}, tokens))
        tokens = sum(t for _, t in parts)
        for done, _ in parts:
            for i, text in done.items():
                hyps[i] = text
    return hyps, tokens


def _check(model, mask, where: str) -> None:
    check_unbatched(mask, where)
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ConfigError(f"{where}: {type(model).__name__} is not an encoder-decoder model; allowed: a "
                          "sequence-to-sequence model (e.g. MarianMTModel, BartForConditionalGeneration, T5)")
    model.eval()


def _unpack(data: Any) -> tuple[list[str], list[str], str]:
    if isinstance(data, ParallelData):
        sources, targets, source = list(data.sources), list(data.targets), data.source
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        sources, targets, source = check_strings("sources", data[0]), check_strings("targets", data[1]), "in-memory"
    else:
        raise DataError(f"data: {type(data).__name__}; allowed: ParallelData or (sources, targets)")
    if not sources:
        raise DataError("sources: empty; translation needs at least one sentence pair")
    if len(sources) != len(targets):
        raise DataError(f"sources has {len(sources)} sentences but targets has {len(targets)}; allowed: equal")
    return sources, targets, source
