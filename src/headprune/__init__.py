"""headprune: find, score and physically remove the attention heads a transformer does not need.

Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?", on transformers v5.

The package follows the pipeline, one subpackage per stage:
model -> :mod:`~headprune.core` (sites, mask, surgery, save/load) -> :mod:`~headprune.scoring`
(I_h, Fisher) -> :mod:`~headprune.selection` (which heads) -> surgery -> saved model;
:mod:`~headprune.compression` chains them under a budget. Studies live in
:mod:`~headprune.evaluation`, :mod:`~headprune.experiments`, :mod:`~headprune.bench`,
:mod:`~headprune.report` and :mod:`~headprune.train` (``pip install 'headprune[study]'``).
This namespace holds what the README uses; it needs only the core dependencies.

Names are imported on first use (PEP 562 ``__getattr__``), so ``import headprune`` -- and with it
``headprune --version`` -- costs no torch or transformers until a name that needs them is read.
"""

from .errors import (
    ConfigError,
    DataError,
    HeadpruneError,
    MaskError,
    PlanError,
    SiteError,
    UnsupportedModelError,
)
from .extras import MissingDependencyError
from .lazy import lazy_names
from .provenance import __version__

# Pinned by tests/test_public_api.py.
__all__ = [
    "__version__", "core", "scoring", "selection", "compression",
    "ConfigError", "DataError", "HeadpruneError", "MaskError", "PlanError", "SiteError", "UnsupportedModelError",
    "MissingDependencyError",
    # model -> sites and FFNs; masks
    "Site", "find_sites", "FFN", "find_ffns",
    "mask_heads", "unmask_heads", "is_masked", "masked", "ones_mask", "mask_from_heads", "masked_neurons",
    # scores
    "head_importance", "importance_sums", "mask_gradients", "normalize_per_site", "fisher_information", "Fisher",
    "fluctuation_scores",
    # selection
    "select_heads", "Budget", "HeadRule", "kv_groups", "lowest_heads",
    # surgery, saving and loading
    "DroppedHeads", "KeptHeads", "prune_heads", "replay_kept_heads", "kept_heads", "original_heads", "fold_scales",
    "prune_neurons", "kept_neurons", "save_pruned", "load_pruned", "load_model",
    # compression: one entry point, its settings, its results
    "compress", "PruneSettings", "CompressResult", "score_heads", "Scores", "plan_heads",
    "CompressPlan",
    "text_batches",
]

SUBPACKAGES = ("core", "scoring", "selection", "compression")
SOURCES = {  # public name -> the module it is read from on first use
    **dict.fromkeys(("CompressPlan", "CompressResult", "PruneSettings", "Scores", "compress",
                     "plan_heads", "score_heads"), "compression"),
    **dict.fromkeys(("FFN", "DroppedHeads", "KeptHeads", "Site", "find_sites", "fold_scales", "is_masked",
                     "kept_heads", "load_model", "load_pruned", "mask_from_heads", "mask_heads", "masked", "ones_mask",
                     "original_heads", "prune_heads", "save_pruned", "unmask_heads", "find_ffns", "kept_neurons",
                     "masked_neurons", "prune_neurons", "replay_kept_heads"), "core"),
    **dict.fromkeys(("Fisher", "fisher_information", "head_importance", "importance_sums", "mask_gradients",
                     "normalize_per_site", "fluctuation_scores"), "scoring"),
    **dict.fromkeys(("Budget", "HeadRule", "kv_groups", "lowest_heads", "select_heads"), "selection"),
    "text_batches": "evaluation.texts",
}


__getattr__, __dir__ = lazy_names(__name__, SOURCES, __all__, globals(), SUBPACKAGES)
