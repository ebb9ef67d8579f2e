"""Reversible masks (imports only :mod:`headprune.core.model`): one composable mask for heads and FFN
neurons (:mod:`.masking`), and weight folding (:mod:`.folding`)."""
