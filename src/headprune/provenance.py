"""What a result was made with: package versions for every run signature (one place, not one per stage)."""

from __future__ import annotations

import importlib.metadata as md
import platform

__version__ = "0.1.0"

PACKAGES = ("headprune", "torch", "transformers", "tokenizers", "safetensors", "sacrebleu", "scipy", "numpy")


def versions() -> dict[str, str]:
    """{package: installed version, or "absent"} for the packages results depend on, and Python's."""
    out = {}
    for package in PACKAGES:
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = "absent"
    out["python"] = platform.python_version()
    return out
