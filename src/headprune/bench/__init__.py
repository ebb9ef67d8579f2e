"""Speed and memory of original, pruned and masked models, beside the FLOP limit.

Names are imported on first use, so reading the settings' defaults (the CLI's flags) costs no torch."""

from ..lazy import lazy_names

SOURCES = {"machine_info": "machine", "BenchResult": "timing", "BenchSettings": "settings", "benchmark": "timing",
           "fraction_plan": "timing", "model_info": "timing", "paired_rounds": "protocol",
           "ProtocolSettings": "protocol"}  # public name -> the module it is read from

__all__ = ["machine_info", "BenchResult", "BenchSettings", "benchmark", "fraction_plan", "model_info", "paired_rounds",
           "ProtocolSettings"]


__getattr__, __dir__ = lazy_names(__name__, SOURCES, __all__, globals())
