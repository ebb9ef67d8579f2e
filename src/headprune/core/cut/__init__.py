"""The irreversible cut (imports only :mod:`headprune.core.model` and :mod:`headprune.core.masks`):
atomic removal of heads (:mod:`.surgery`) and FFN neurons (:mod:`.neurons`) with the snapshot that
makes it atomic (:mod:`.snapshot`), the biases kept, what stands in for removed units
(:mod:`.standins`), and which units of one projection to remove by their OBS error (:mod:`.obs`)."""
