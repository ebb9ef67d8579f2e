"""headprune: find, score and physically remove the attention heads a transformer does not need.

Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?", on transformers v5.

The package follows the pipeline, one subpackage per stage:
model -> :mod:`~headprune.core` (sites, mask, surgery, save/load) -> :mod:`~headprune.scoring`
(I_h, Fisher) -> :mod:`~headprune.selection` (which heads) -> surgery -> saved model;
:mod:`~headprune.compression` chains them under a budget. Studies live in
:mod:`~headprune.evaluation`, :mod:`~headprune.experiments`, :mod:`~headprune.bench`,
:mod:`~headprune.report` and :mod:`~headprune.train` (``pip install 'headprune[study]'``).
This namespace holds what the README uses; it needs only the core dependencies.
"""

from . import compression, core, scoring, selection
from .compression import (
    CompressPlan,
    CompressResult,
    CompressSettings,  # noqa: F401  (deprecated: PruneSettings)
    PruneSettings,
    Scores,
    UnitResult,
    UnitSettings,  # noqa: F401  (deprecated: PruneSettings)
    compress,
    compress_units,  # noqa: F401  (deprecated: compress)
    plan_heads,
    score_heads,
)
from .core import (
    FFN,
    DroppedHeads,
    KeptHeads,
    Site,
    find_ffns,
    find_sites,
    fold_scales,
    is_masked,
    kept_heads,
    kept_neurons,
    load_model,
    load_pruned,
    mask_from_heads,
    mask_heads,
    masked,
    masked_neurons,
    ones_mask,
    original_heads,
    prune_heads,
    prune_neurons,
    save_pruned,
    unmask_heads,
)
from .errors import (
    ConfigError,
    DataError,
    HeadpruneError,
    MaskError,
    PlanError,
    SiteError,
    UnsupportedModelError,
)
from .evaluation.texts import text_batches
from .extras import MissingDependencyError
from .provenance import __version__
from .renamed import keep_heads, replay_kept_heads  # noqa: F401  (keep_heads: deprecated)
from .scoring import (
    Fisher,
    fisher_information,
    head_importance,
    importance_sums,
    mask_gradients,
    normalize_per_site,
)
from .selection import kv_groups, lowest_heads, select_heads

# Pinned by tests/test_public_api.py. Kept importable but not listed (deprecated for one release):
# keep_heads (-> replay_kept_heads), compress_units (-> compress with PruneSettings), and the pipelines'
# own settings CompressSettings / UnitSettings (-> PruneSettings).
__all__ = [
    "__version__", "core", "scoring", "selection", "compression",
    "ConfigError", "DataError", "HeadpruneError", "MaskError", "PlanError", "SiteError", "UnsupportedModelError",
    "MissingDependencyError",
    # model -> sites and FFNs; masks
    "Site", "find_sites", "FFN", "find_ffns",
    "mask_heads", "unmask_heads", "is_masked", "masked", "ones_mask", "mask_from_heads", "masked_neurons",
    # scores
    "head_importance", "importance_sums", "mask_gradients", "normalize_per_site", "fisher_information", "Fisher",
    # selection
    "select_heads", "kv_groups", "lowest_heads",
    # surgery, saving and loading
    "DroppedHeads", "KeptHeads", "prune_heads", "replay_kept_heads", "kept_heads", "original_heads", "fold_scales",
    "prune_neurons", "kept_neurons", "save_pruned", "load_pruned", "load_model",
    # compression: one entry point, its settings, its results
    "compress", "PruneSettings", "CompressResult", "UnitResult", "score_heads", "Scores", "plan_heads",
    "CompressPlan",
    "text_batches",
]
