"""The built-in compensations, one module each; :mod:`headprune.compression.compensation` registers them."""

from .bias import Bias
from .linear import Linear
from .linear_seq import LinearSequential
from .obs_seq import ObsSequential
from .rearrange import Rearrange
from .refit import Reconstruct
from .tune import Tune

BUILT_IN = (Rearrange(), Tune(), Reconstruct(), Bias(), Linear(), LinearSequential(), ObsSequential())

__all__ = ["Bias", "Linear", "LinearSequential", "ObsSequential", "Rearrange", "Reconstruct", "Tune", "BUILT_IN"]
