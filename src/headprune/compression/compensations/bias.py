"""``bias``: every removed unit held at its calibration mean, folded into its output projection's bias (FLAP's
compensation; exact mean replacement, no labels, so not guarded). Runs before the cut, on the channel means."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...core.cut.biases import mean_shifts, shift_biases


@dataclass(frozen=True)
class Bias:
    """No settings: the means are exact."""

    name: ClassVar[str] = "bias"
    stage: ClassVar[str] = "standin"
    gram: ClassVar[bool] = False  # needs the channel means only

    def apply(self, pruned, model, stats, dropped_heads, dropped_neurons, settings) -> tuple[str, dict]:
        """(the stage's note, the bias shifts added: the plan records them, so a replay needs no statistics)."""
        shifts = mean_shifts(model, stats.mean, dropped_heads, dropped_neurons)
        shift_biases(pruned, shifts)
        return "kept (unguarded: removed units held at their calibration means)", shifts
