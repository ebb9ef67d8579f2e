"""headprune: find, score and physically remove the attention heads a transformer does not need.

Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?", on transformers v5.
"""

__version__ = "0.1.0"

from .compress import CompressResult, CompressSettings, compress, plan_heads, score_heads  # noqa: E402
from .errors import (  # noqa: E402
    ConfigError,
    DataError,
    HeadpruneError,
    MaskError,
    PlanError,
    SiteError,
    UnsupportedModelError,
)
from .fisher import fisher_information  # noqa: E402
from .importance import head_importance, mask_gradients, normalize_per_site  # noqa: E402
from .io import load_pruned, save_pruned  # noqa: E402
from .masking import is_masked, mask_from_heads, mask_heads, masked, ones_mask, unmask_heads  # noqa: E402
from .sites import Site, find_sites  # noqa: E402
from .surgery import apply_plan, kept_heads, original_heads, prune_heads  # noqa: E402

__all__ = [
    "__version__", "ConfigError", "DataError", "HeadpruneError", "MaskError", "PlanError", "SiteError",
    "UnsupportedModelError", "Site", "find_sites", "mask_heads", "unmask_heads", "is_masked", "masked",
    "ones_mask", "mask_from_heads", "head_importance", "mask_gradients", "normalize_per_site", "prune_heads",
    "apply_plan", "kept_heads", "original_heads", "save_pruned", "load_pruned", "compress", "CompressResult",
    "CompressSettings", "plan_heads", "score_heads", "fisher_information",
]
