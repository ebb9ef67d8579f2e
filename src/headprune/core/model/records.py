"""What a pruned model carries in its config: the names of headprune's records and how to read them.

The bottom of the core: every module above reads these keys from here, so nothing imports surgery
to learn a constant. Two kinds of head lists, two names (never "plan" for both):

- :data:`DroppedHeads` ``{site: [indices among the heads the site has now]}``: what to remove.
- :data:`KeptHeads` ``{site: [original indices of the heads the site keeps]}``: what a pruned model is,
  saved in ``config.json`` under :data:`KEPT_KEY`.

FFN neurons have the same two records (:data:`KEPT_NEURONS_KEY`, :data:`ORIGINAL_NEURONS_KEY`).
"""

from __future__ import annotations

KEPT_KEY = "headprune_kept_heads"  # config attribute: KeptHeads of the model
ORIGINAL_KEY = "headprune_original_heads"  # config attribute: {site: number of heads before any pruning}
LEGACY_KEYS = {KEPT_KEY: "headprune_plan", ORIGINAL_KEY: "headprune_heads"}  # written by headprune 0.1.0
KEPT_NEURONS_KEY = "headprune_kept_neurons"  # config attribute: {ffn: original indices of the kept neurons}
ORIGINAL_NEURONS_KEY = "headprune_original_neurons"  # config attribute: {ffn: width before any pruning}
VERSION_KEY = "headprune_version"  # config attribute: the headprune that saved the model
LAYOUT_KEY = "headprune_layout_reason"  # config.json of a pruned model not saved stock: why (read back, then dropped)
ADDED_BIASES_KEY = "headprune_added_biases"  # config attribute: [site / ffn whose output projection got a bias]
CALLS_KEY = "headprune_calls"  # config attribute: {attention class: call template} of sites with no heads left
RECORD_KEYS = (KEPT_KEY, ORIGINAL_KEY, *LEGACY_KEYS.values(), KEPT_NEURONS_KEY, ORIGINAL_NEURONS_KEY, LAYOUT_KEY,
               CALLS_KEY, ADDED_BIASES_KEY)

DroppedHeads = dict[str, list[int]]  # {site: indices among the heads the site has now} -- to remove
KeptHeads = dict[str, list[int]]  # {site: original indices of the heads the site keeps} -- what is left


def config_record(config, key: str) -> dict | None:
    """A headprune record of ``config`` (one of :data:`RECORD_KEYS`), read under its 0.1.0 name too; None when
    absent or empty."""
    value = getattr(config, key, None)
    if value is None and key in LEGACY_KEYS:
        value = getattr(config, LEGACY_KEYS[key], None)
    return dict(value) if value else None
