"""Post-training compression (Kwon et al. 2022, on heads): plan under a budget, tune, fold, remove."""

from .compress import CompressResult, compress
from .plan import METHODS, CompressPlan, CompressSettings, Scores, plan_heads, score_heads
from .tuning import TuneResult, scale_mask, tune_scales

__all__ = ["CompressResult", "compress", "METHODS", "CompressPlan", "CompressSettings", "Scores", "plan_heads",
           "score_heads", "TuneResult", "scale_mask", "tune_scales"]

# heads and FFN neurons under one budget, with the least-squares reconstruction (issue 16)
from .reconstruct import reconstruct  # noqa: E402
from .units import UnitResult, UnitSettings, compress_units  # noqa: E402

__all__ += ["reconstruct", "UnitResult", "UnitSettings", "compress_units"]
