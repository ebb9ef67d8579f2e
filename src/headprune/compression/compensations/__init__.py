"""The built-in compensations, one module each; :mod:`headprune.compression.compensation` registers them
(``linear-seq`` and ``obs-seq`` are settings of :class:`Linear`)."""

from .bias import Bias
from .linear import LINEAR_SEQ, OBS_SEQ, Linear
from .rearrange import Rearrange
from .refit import Reconstruct
from .tune import Tune

BUILT_IN = (Rearrange(), Tune(), Reconstruct(), Bias(), Linear(), LINEAR_SEQ, OBS_SEQ)

__all__ = ["Bias", "Linear", "Rearrange", "Reconstruct", "Tune", "BUILT_IN"]
