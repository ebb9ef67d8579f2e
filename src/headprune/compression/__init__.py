"""Post-training compression: one entry point, :func:`compress` with :class:`PruneSettings` (heads, FFN
neurons or both; a share of their count, FLOPs, parameters, KV-cache bytes or latency, or a count).

Stages: scores (:func:`score_heads`) -> the plan (:func:`plan_heads`: selection, Fisher rearrangement,
tuned scales; Kwon et al. 2022) or one budget over heads and neurons with a least-squares
:func:`reconstruct` -> fold, remove."""

from .compensation import Compensation, compensation_names, register_compensation
from .entry import compress
from .plan import CompressPlan, Scores, plan_heads, score_heads
from .reconstruct import reconstruct
from .result import CompressResult
from .settings import PruneSettings
from .tuning import TuneResult, scale_mask, tune_scales

__all__ = ["compress", "PruneSettings", "CompressResult", "CompressPlan", "Scores", "plan_heads",
           "score_heads", "TuneResult", "scale_mask", "tune_scales", "reconstruct", "Compensation",
           "compensation_names", "register_compensation"]
