"""``linear``: every removed unit replaced by its least-squares affine prediction from the kept ones on the
calibration tokens, folded into the kept columns and the biases (:func:`headprune.core.standins.linear_standins`;
ridge ``settings.damping``). Runs before the cut, on the channel means and second moments; not guarded."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.standins import linear_standins


@dataclass(frozen=True)
class Linear:
    name: str = "linear"
    stage: str = "standin"
    gram: bool = True  # needs the kept features' second moments

    def apply(self, pruned, model, stats, dropped_heads, dropped_neurons, settings) -> str:
        linear_standins(pruned, stats.mean, stats.second, dropped_heads, dropped_neurons, damping=settings.damping)
        return ("kept (unguarded: removed units replaced by their least-squares affine prediction from the kept ones "
                "on the calibration tokens)")
