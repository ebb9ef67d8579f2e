"""Speed and memory of original, pruned and masked models, beside the FLOP limit.

Names are imported on first use, so reading the settings' defaults (the CLI's flags) costs no torch."""

import importlib

SOURCES = {"machine_info": "machine", "BenchResult": "timing", "BenchSettings": "settings", "benchmark": "timing",
           "fraction_plan": "timing", "model_info": "timing"}  # public name -> the module it is read from

__all__ = ["machine_info", "BenchResult", "BenchSettings", "benchmark", "fraction_plan", "model_info"]


def __getattr__(name: str):
    if name not in SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{SOURCES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
