"""The core: where the heads are (sites), the reversible mask, the irreversible surgery, what a pruned
model runs (runtime), weight folding, save/load, and the one FLOP counter. Needs torch + transformers."""

from .cost import HeadCosts, flop_breakdown, flops_per_example, head_costs
from .ffn import FFN, find_ffns
from .folding import fold_scales
from .inputs import example_inputs, model_inputs
from .io import load_model, load_pruned, load_tokenizer, save_pruned
from .masking import (
    HeadMask,
    active_masks,
    is_masked,
    mask_from_heads,
    mask_heads,
    masked,
    ones_mask,
    unmask_heads,
)
from .neurons import keep_neurons, kept_neurons, masked_neurons, neuron_mask_from, prune_neurons
from .sites import Site, find_sites, sites_table
from .surgery import DroppedHeads, KeptHeads, keep_heads, kept_heads, original_heads, prune_heads

__all__ = [
    "HeadCosts", "flop_breakdown", "flops_per_example", "head_costs", "fold_scales", "example_inputs",
    "model_inputs", "load_model", "load_pruned", "load_tokenizer", "save_pruned", "HeadMask", "active_masks",
    "is_masked", "mask_from_heads", "mask_heads", "masked", "ones_mask", "unmask_heads", "Site", "find_sites",
    "sites_table", "DroppedHeads", "KeptHeads", "keep_heads", "kept_heads", "original_heads", "prune_heads",
    "FFN", "find_ffns", "keep_neurons", "kept_neurons", "masked_neurons", "neuron_mask_from", "prune_neurons",
]
