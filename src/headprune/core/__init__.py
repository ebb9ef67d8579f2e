"""The core, in sub-packages that are layers (each imports only from itself or lower ones; pinned by
tests/test_architecture.py):

1. :mod:`.model` -- the model as headprune reads it: the config keys a pruned model carries
   (:mod:`.model.records`), the family table, sites (heads), FFNs (neurons), what a model keeps, what a
   pruned model runs (:mod:`.model.runtime`), costs, and helpers that know a model only by its inputs,
   parameters or calls (devices, inputs, calls, :mod:`.model.finite`: NaN and inf refused);
2. :mod:`.masks` -- one reversible unit mask for heads and neurons (:mod:`.masks.masking`), weight folding;
3. :mod:`.cut` -- the irreversible, atomic cut of heads (:mod:`.cut.surgery`) and neurons
   (:mod:`.cut.neurons`), stand-ins for removed units, OBS;
4. :mod:`.store` -- the directory layout, stock configs, unverified save and load (:mod:`.store.saving`),
   GGUF files;
5. :mod:`.safety` -- the trial on a shrunk copy (:mod:`.safety.trial`, :mod:`.safety.verify`);
6. the public functions that verify, then cut or load (:mod:`.prune`, :mod:`.io`), beside the layers.

Needs torch + transformers."""

from .io import load_model, load_pruned, load_tokenizer, save_pruned
from .masks.folding import fold_scales
from .masks.masking import (
    HeadMask,
    active_masks,
    is_masked,
    mask_from_heads,
    mask_heads,
    masked,
    masked_neurons,
    neuron_mask_from,
    ones_mask,
    unmask_heads,
)
from .model.cost import HeadCosts, flop_breakdown, flops_per_example, head_costs
from .model.ffn import FFN, find_ffns
from .model.inputs import example_inputs, model_inputs
from .model.kept import kept_heads, kept_neurons, original_heads
from .model.records import DroppedHeads, KeptHeads
from .model.sites import Site, find_sites, sites_table
from .prune import keep_heads, prune_heads, prune_neurons, replay_kept_heads

__all__ = [
    "HeadCosts", "flop_breakdown", "flops_per_example", "head_costs", "fold_scales", "example_inputs",
    "model_inputs", "load_model", "load_pruned", "load_tokenizer", "save_pruned", "HeadMask", "active_masks",
    "is_masked", "mask_from_heads", "mask_heads", "masked", "ones_mask", "unmask_heads", "Site", "find_sites",
    "sites_table", "DroppedHeads", "KeptHeads", "keep_heads", "kept_heads", "original_heads", "prune_heads",
    "FFN", "find_ffns", "replay_kept_heads", "kept_neurons", "masked_neurons", "neuron_mask_from", "prune_neurons",
]
