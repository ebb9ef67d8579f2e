"""Post-training compression: one entry point, :func:`compress` with :class:`PruneSettings` (heads, FFN
neurons or both; a share of their count, FLOPs, parameters, KV-cache bytes or latency, or a count).

Stages: scores (:func:`score_heads`) -> the plan (:func:`plan_heads`: selection, Fisher rearrangement,
tuned scales; Kwon et al. 2022) or one budget over heads and neurons with a least-squares
:func:`reconstruct` -> fold, remove."""

from .compress import CompressResult
from .entry import compress
from .plan import METHODS, CompressPlan, CompressSettings, Scores, plan_heads, score_heads
from .reconstruct import reconstruct
from .settings import PruneSettings
from .tuning import TuneResult, scale_mask, tune_scales
from .units import UnitResult, UnitSettings, compress_units

__all__ = ["compress", "PruneSettings", "CompressResult", "UnitResult", "METHODS", "CompressPlan", "CompressSettings",
           "Scores", "plan_heads", "score_heads", "TuneResult", "scale_mask", "tune_scales", "reconstruct",
           "UnitSettings", "compress_units"]
