"""What every evaluator returns (:class:`EvalResult`), and the mask and argument helpers they share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from ..core.masks.masking import masked
from ..core.store.loading import new_head_keys
from ..errors import ConfigError, DataError


@dataclass
class EvalResult:
    """A corpus score and the per-example results behind it (for significance tests)."""

    metric: str  # e.g. "accuracy", "bleu", "perplexity"
    score: float
    n: int  # examples scored
    per_example: dict[str, np.ndarray]  # name -> [n] (e.g. "correct", "loss", "nll_sum", "tokens")
    higher_is_better: bool = True
    extra: dict = field(default_factory=dict)  # other corpus metrics (f1, matthews, sacrebleu signature)
    seconds: float = 0.0
    tokens: int = 0

    @property
    def examples_per_s(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self, per_example: bool = False) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "per_example"}
        d.update(examples_per_s=self.examples_per_s, tokens_per_s=self.tokens_per_s)
        if per_example:
            d["per_example"] = {k: v.tolist() for k, v in self.per_example.items()}
        return d


def mask_context(model, mask: Mapping[str, torch.Tensor] | None):
    return nullcontext() if mask is None else masked(model, mask)


def check_trained(model, where: str) -> None:
    """Refuse to score a model loaded with a fresh head (``new_head=True``): its accuracy would be a random
    head's, reported as the trained model's."""
    fresh = new_head_keys(model)
    if fresh:
        raise ConfigError(f"{where}: the model was loaded with a new, untrained head ({', '.join(fresh[:3])}"
                          f"{' ...' if len(fresh) > 3 else ''}); allowed: a trained model (fine-tune it first, "
                          "e.g. headprune train classifier)")


def check_strings(name: str, values: Any) -> list[str]:
    """``values`` as a list of str, or a DataError naming the first item that is not one."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise DataError(f"{name}: {type(values).__name__}; allowed: a list of str")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DataError(f"{name}[{i}] = {v!r:.40} ({type(v).__name__}); allowed: str")
    return list(values)


def check_unbatched(mask: Mapping[str, Any] | None, where: str) -> None:
    """Length-bucketed batches (and beam search) reorder and resize the batch: only [heads] masks fit."""
    for name, value in (mask or {}).items():
        shape = tuple(getattr(value, "shape", np.shape(value)))
        if len(shape) == 2:
            raise ConfigError(f"{where}: mask[{name!r}] has shape {shape}, a batched [batch, heads] mask; "
                              f"allowed: one [heads] tensor per site (examples are reordered into length buckets)")
