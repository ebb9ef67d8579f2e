"""Speed and memory of original, pruned and masked models, beside the FLOP limit."""

from .machine import machine_info
from .timing import BenchResult, BenchSettings, benchmark, fraction_plan, model_info

__all__ = ["machine_info", "BenchResult", "BenchSettings", "benchmark", "fraction_plan", "model_info"]
