"""Names kept for one release after a rename: each use warns once per call site, naming the replacement.

The library warns with :class:`DeprecationWarning` (pointed at the caller's line); the CLI prints the same
sentence on stderr (:func:`headprune.cli.compress_flags.deprecated_flag`).
"""

from __future__ import annotations

import warnings

from . import core

REMOVAL = "it will be removed in the release after next"


def deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated and ``new`` replaces it."""
    warnings.warn(f"{old} is deprecated; use {new} ({REMOVAL})", DeprecationWarning, stacklevel=stacklevel)


def keep_heads(model, kept, original=None, *, verify: bool = True):
    """Deprecated name of :func:`replay_kept_heads` (``keep_heads`` read as "keep N heads")."""
    deprecated("headprune.keep_heads", "headprune.replay_kept_heads")
    return core.keep_heads(model, kept, original, verify=verify)


replay_kept_heads = core.keep_heads  # replay KeptHeads ({site: original indices kept}) on an unpruned model
