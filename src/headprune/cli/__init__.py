"""The ``headprune`` command: a thin layer that parses flags, calls the library and reports.

One module per command group, each registering its commands on :data:`.app.app`:
``model`` (sites, prune, demo), ``evaluate``, ``study`` (the paper's experiments), ``compress``,
``bench`` and ``train``. Flags shared by several commands live in ``options``.
"""

from __future__ import annotations

import sys

from . import bench, compress, evaluate, export, importance, model, study, train  # noqa: F401  (each registers its commands)
from .app import app, escape_help

escape_help(app)


def main() -> None:
    app(prog_name="headprune")


__all__ = ["app", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
