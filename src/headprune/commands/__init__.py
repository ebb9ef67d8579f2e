"""CLI commands by area. Each module defines ``@app.command()`` functions on :data:`headprune.cli.app`;
importing it registers them. Keep each command thin: parse, call the library, print."""

import importlib

AREAS = ("train", "evaluate", "study", "bench", "compress")


def register_all() -> None:
    for area in AREAS:
        try:
            importlib.import_module(f"{__name__}.{area}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{area}":
                raise
