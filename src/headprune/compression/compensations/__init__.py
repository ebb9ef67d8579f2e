"""The built-in compensations, one module each; :mod:`headprune.compression.compensation` registers them
(``linear-seq`` and ``obs-seq`` are variants of :class:`Linear`, not classes of their own)."""

from .bias import Bias
from .distill import Distill
from .linear import Linear
from .rearrange import Rearrange
from .refit import Reconstruct
from .tune import Tune

BUILT_IN = (Rearrange(), Tune(), Reconstruct(), Bias(), Linear(), Linear(variant="linear-seq"),
            Linear(variant="obs-seq"), Distill())

__all__ = ["Bias", "Distill", "Linear", "Rearrange", "Reconstruct", "Tune", "BUILT_IN"]
