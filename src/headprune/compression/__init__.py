"""Post-training compression: one entry point, :func:`compress` with :class:`PruneSettings` (heads, FFN
neurons or both; a share of their count, FLOPs, parameters, KV-cache bytes or latency, or a count).

Stages: scores (:func:`score_heads`) -> the plan (:func:`plan_heads`: selection, Fisher rearrangement,
tuned scales; Kwon et al. 2022) or one budget over heads and neurons with a least-squares
:func:`reconstruct` -> fold, remove. The compensations are objects with their own settings (:class:`Tune`,
:class:`Reconstruct`, :class:`Linear`, :class:`Bias`, :class:`Rearrange`, :class:`Distill`), given to
:class:`PruneSettings` by name or as objects."""

from .compensation import Compensation, compensation_names, register_compensation
from .compensations import Bias, Distill, Linear, Rearrange, Reconstruct, Tune
from .entry import compress
from .plan import CompressPlan, Scores, plan_heads, score_heads
from .reconstruct import reconstruct
from .result import CompressResult
from .settings import PruneSettings
from .tuning import TuneResult, scale_mask, tune_scales

__all__ = ["compress", "PruneSettings", "CompressResult", "CompressPlan", "Scores", "plan_heads",
           "score_heads", "TuneResult", "scale_mask", "tune_scales", "reconstruct", "Compensation",
           "compensation_names", "register_compensation", "Bias", "Distill", "Linear", "Rearrange", "Reconstruct",
           "Tune"]
