"""Tasks: data + metric, evaluated under an optional head mask, with per-example results."""

from .base import EvalResult
from .lm import LanguageModelling

__all__ = ["EvalResult", "LanguageModelling"]
