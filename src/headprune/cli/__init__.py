"""The ``headprune`` command: a thin layer that parses flags, calls the library and reports.

One module per command group, each registering its commands on :data:`.app.app`:
``model`` (sites, prune, demo), ``evaluate``, ``study`` (the paper's experiments), ``compress``,
``bench``, ``recover`` and ``train``. Flags shared by several commands live in ``options``.
"""

from __future__ import annotations

import os
import sys

from . import apply, bench, compress, evaluate, export, harness, importance, model, recover, study, train  # noqa: F401  (each registers its commands)
from .app import app, escape_help

escape_help(app)


def main() -> None:
    """The command line; under ``torchrun --nproc_per_node N`` the processes split the work
    (:mod:`headprune.distributed`) and rank 0 writes. One process needs no process group (nor torch, to start:
    ``headprune --version`` and ``--help`` import neither torch nor transformers)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        app(prog_name="headprune")
        return
    from ..distributed import init_from_env, is_main, sharded

    with sharded(init_from_env()):
        if not is_main():  # one report on the terminal: rank 0's (errors still reach stderr)
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (for the life of the process)
        app(prog_name="headprune")


__all__ = ["app", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
