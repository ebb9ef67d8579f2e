"""Language modelling: perplexity and per-token negative log-likelihood of a causal LM."""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import torch

from ..core.model.chunked import token_outputs
from ..core.model.devices import input_device, to_device
from ..core.model.finite import check_finite, check_finite_weights
from ..distributed import reduce_arrays, shard
from ..errors import ConfigError, DataError
from ..progress import progress_bar
from .base import EvalResult, check_trained, check_unbatched, mask_context
from .batching import Batches
from .metrics import perplexity


def prefix_token_id(tokenizer) -> int:
    """The token every window starts with, chosen as lm-evaluation-harness chooses it for rolling windows: the
    tokenizer's BOS id, else its EOS id (not its ``add_bos_token`` flag, which a GGUF tokenizer may set to False
    for a model that needs its BOS). A tokenizer with neither is refused."""
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise ConfigError("tokenizer has neither bos_token_id nor eos_token_id, so windows cannot start with the model's "
                      "prefix token; allowed: a tokenizer with one, or prefix=False (CLI: --no-prefix-token)")


def lm_blocks(tokenizer, texts: list[str], block_size: int, *, prefix: bool = True,
              max_blocks: int | None = None) -> torch.Tensor:
    """[N, block_size] token ids of ``texts`` (each followed by EOS), cut by :func:`cut_blocks` with the
    model's prefix token (:func:`prefix_token_id`) when ``prefix``."""
    if not texts:
        raise DataError("texts: empty; language modelling needs at least one non-empty text")
    first = prefix_token_id(tokenizer) if prefix else None
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
    return cut_blocks(ids, block_size, first, max_blocks)


def cut_blocks(ids: list[int], block_size: int, prefix: int | None, max_blocks: int | None = None) -> torch.Tensor:
    """[N, block_size] consecutive blocks of the token ids ``ids`` (at most ``max_blocks``).

    With a ``prefix`` token id, each block is that token and the next ``block_size - 1`` text tokens, so every
    text token of a block is predicted from the context the model is used with (lm-evaluation-harness starts its
    rolling windows so); with None, ``block_size`` text tokens, the first not predicted.
    """
    if block_size < 2:
        raise ConfigError(f"block_size={block_size}; allowed: >= 2")
    width = block_size - (prefix is not None)  # text tokens per block
    n_blocks = len(ids) // width
    if max_blocks is not None:
        n_blocks = min(n_blocks, max_blocks)
    if n_blocks == 0:
        raise DataError(f"texts: {len(ids)} tokens, fewer than one block of {width} text tokens")
    blocks = torch.tensor(ids[: n_blocks * width], dtype=torch.long).view(n_blocks, width)  # [N, width]
    if prefix is None:
        return blocks
    return torch.cat([torch.full((n_blocks, 1), prefix, dtype=torch.long), blocks], dim=1)  # [N, block_size]


class LanguageModelling:
    """Texts cut into blocks of ``block_size`` tokens; each block is one example.

    ``prefix`` (default): every block starts with the model's prefix token (BOS, else EOS; see
    :func:`lm_blocks`), as the model is used and as lm-evaluation-harness measures it; ``prefix=False`` cuts
    plain text blocks (recorded in the signature either way). The score is the perplexity
    exp(total NLL / tokens) over all predicted tokens (``block_size - 1`` per block).
    ``per_example``: ``nll_sum`` and ``tokens`` per block (perplexity is resampled from them).
    """

    metric = "perplexity"
    higher_is_better = False

    def __init__(self, tokenizer, texts: list[str], *, block_size: int = 128, batch_size: int = 8,
                 max_blocks: int | None = None, prefix: bool = True):
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size}; allowed: >= 1")
        if not isinstance(prefix, bool):
            raise ConfigError(f"prefix={prefix!r}; allowed: True or False")
        self.blocks = lm_blocks(tokenizer, texts, block_size, prefix=prefix, max_blocks=max_blocks)  # [N, T]
        n_blocks = self.blocks.shape[0]
        self.batch_size = batch_size
        self.prefix_token = int(self.blocks[0, 0]) if prefix else None
        self.signature = {"task": "lm", "block_size": block_size, "blocks": n_blocks, "tokens": n_blocks * block_size,
                          "batch_size": batch_size, "prefix_token": self.prefix_token}

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def batches(self, *, limit: int | None = None) -> Batches:
        """Model inputs with labels (the inputs themselves), for importance scoring; ``len`` is their count."""
        blocks = self.blocks if limit is None else self.blocks[:limit]
        starts = range(0, blocks.shape[0], self.batch_size)

        def make(x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x}

        return Batches((make(blocks[i : i + self.batch_size]) for i in starts), len(starts))

    @torch.no_grad()
    def evaluate(self, model, mask: Mapping[str, torch.Tensor] | None = None, *, progress: bool = False,
                 limit: int | None = None) -> EvalResult:
        check_unbatched(mask, "LanguageModelling.evaluate")
        check_trained(model, "LanguageModelling.evaluate")
        check_finite_weights(model)  # a NaN weight the texts never reach would leave a finite perplexity
        model.eval()
        start = time.perf_counter()
        batches = list(self.batches(limit=limit))
        n = sum(b["input_ids"].shape[0] for b in batches)
        nll_sum, n_tok = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64)
        first = np.cumsum([0] + [b["input_ids"].shape[0] for b in batches])  # each batch's first block
        with mask_context(model, mask):
            for i, batch in progress_bar(list(shard(enumerate(batches))), desc="perplexity", unit="batch", show=progress):
                batch = to_device(batch, input_device(model))
                out = token_outputs(model, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]})
                token_nll = out.shifted().token_nll(batch["input_ids"][:, 1:])  # [B, T-1], chunk by chunk
                check_finite(token_nll, f"the token losses of batch {i}")
                rows = slice(first[i], first[i] + token_nll.shape[0])
                nll_sum[rows] = token_nll.sum(-1).double().cpu().numpy()
                n_tok[rows] = token_nll.shape[1]
        nll_sum, n_tok = reduce_arrays(nll_sum, n_tok)  # under torchrun: each rank's blocks
        seconds = time.perf_counter() - start
        return EvalResult(metric="perplexity", score=perplexity(nll_sum, n_tok), n=len(nll_sum),
                          per_example={"nll_sum": nll_sum, "tokens": n_tok}, higher_is_better=False,
                          seconds=seconds, tokens=int(n_tok.sum() + len(n_tok)))
