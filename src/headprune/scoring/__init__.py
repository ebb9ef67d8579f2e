"""Scores from one mask-gradient pass: I_h (Michel et al. 4.1) and the empirical Fisher (Kwon et al.); and
FLAP's label-free fluctuation from one forward pass (An et al. 2024)."""

from .checkpointing import checkpointed_blocks
from .fisher import Fisher, fisher_information
from .gradients import LossFn, mask_gradients, mean_loss, per_example_loss
from .importance import head_importance, importance_sums, normalize_per_site

__all__ = ["checkpointed_blocks", "Fisher", "fisher_information", "LossFn", "mask_gradients", "mean_loss", "per_example_loss",
           "head_importance", "importance_sums", "normalize_per_site"]

from .units import UnitFisher, unit_fisher, unit_gradients  # noqa: E402  (heads and FFN neurons, one backward)

__all__ += ["UnitFisher", "unit_fisher", "unit_gradients"]

from .fluctuation import ChannelStats, Fluctuation, channel_stats, fluctuation_scores  # noqa: E402  (FLAP, no labels)

__all__ += ["ChannelStats", "Fluctuation", "channel_stats", "fluctuation_scores"]
