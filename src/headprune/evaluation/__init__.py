"""Tasks (data + metric) evaluated under an optional head mask, with per-example results; data loaders;
metrics. Significance tests live in :mod:`.significance` (needs the ``study`` extra: scipy)."""

from .base import EvalResult
from .build import TASKS, EvalOptions, TaskData, build_task
from .classification import Classification
from .lm import LanguageModelling
from .metrics import bleu_from_stats, format_score
from .translation import Translation

__all__ = ["EvalResult", "TASKS", "EvalOptions", "TaskData", "build_task", "Classification", "LanguageModelling", "bleu_from_stats",
           "format_score", "Translation"]
