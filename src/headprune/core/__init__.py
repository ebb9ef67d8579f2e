"""The core, in layers (each module imports only from its own layer or lower ones; pinned by
tests/test_architecture.py):

1. records -- what a pruned model carries (:mod:`.records`), and helpers that know no model
   (devices, inputs, calls, gguf) or only its parameters (:mod:`.finite`: NaN and inf refused);
2. the model -- sites (heads), FFNs (neurons), what a model keeps (:mod:`.kept`), what a pruned model
   runs (runtime), costs;
3. masks -- one reversible unit mask for heads and neurons (:mod:`.masking`), weight folding;
4. surgery -- the irreversible, atomic cut of heads (:mod:`.surgery`) and neurons (:mod:`.neurons`);
5. io -- the directory layout, stock configs, unverified save and load (:mod:`.saving`);
6. verification -- the trial on a shrunk copy (:mod:`.trial`, :mod:`.verify`);
7. the public functions that verify, then cut or load (:mod:`.prune`, :mod:`.io`).

Needs torch + transformers."""

from .cost import HeadCosts, flop_breakdown, flops_per_example, head_costs
from .ffn import FFN, find_ffns
from .folding import fold_scales
from .inputs import example_inputs, model_inputs
from .io import load_model, load_pruned, load_tokenizer, save_pruned
from .kept import kept_heads, kept_neurons, original_heads
from .masking import (
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
from .prune import keep_heads, prune_heads, prune_neurons, replay_kept_heads
from .records import DroppedHeads, KeptHeads
from .sites import Site, find_sites, sites_table

__all__ = [
    "HeadCosts", "flop_breakdown", "flops_per_example", "head_costs", "fold_scales", "example_inputs",
    "model_inputs", "load_model", "load_pruned", "load_tokenizer", "save_pruned", "HeadMask", "active_masks",
    "is_masked", "mask_from_heads", "mask_heads", "masked", "ones_mask", "unmask_heads", "Site", "find_sites",
    "sites_table", "DroppedHeads", "KeptHeads", "keep_heads", "kept_heads", "original_heads", "prune_heads",
    "FFN", "find_ffns", "replay_kept_heads", "kept_neurons", "masked_neurons", "neuron_mask_from", "prune_neurons",
]
