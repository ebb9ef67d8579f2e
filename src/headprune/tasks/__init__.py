"""Tasks: data + metric, evaluated under an optional head mask, with per-example results."""

from .base import EvalResult
from .classification import Classification
from .lm import LanguageModelling
from .translation import Translation, bleu_from_stats

__all__ = ["EvalResult", "Classification", "LanguageModelling", "Translation", "bleu_from_stats"]
