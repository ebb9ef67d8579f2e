"""matplotlib, headless, through the ``study`` extra (one place that imports it)."""

from __future__ import annotations

from ..extras import require


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (a clear error without the extra)."""
    matplotlib = require("matplotlib", "figures")
    matplotlib.use("Agg")
    return require("matplotlib.pyplot", "figures")
