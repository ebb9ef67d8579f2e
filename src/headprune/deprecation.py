"""Names kept for one release after a rename: each use warns, naming the replacement.

The library warns with :class:`DeprecationWarning` (pointed at the caller's line); the CLI prints the same
sentence on stderr.
"""

from __future__ import annotations

import warnings

REMOVAL = "it will be removed in the release after next"


def deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated and ``new`` replaces it."""
    warnings.warn(deprecation_line(old, new), DeprecationWarning, stacklevel=stacklevel)


def deprecation_line(old: str, new: str) -> str:
    return f"{old} is deprecated; use {new} ({REMOVAL})"
