"""``fisher``: the diagonal empirical Fisher of the unit masks, sum over examples of (dL_b/dxi_u)^2.

Asked for ``request.blocks``, the full per-site Fisher blocks too (:func:`headprune.scoring.fisher.fisher_information`:
rearrangement and tuning read them); for the budget over heads and neurons, heads and neurons in one backward
per batch (:func:`headprune.scoring.units.unit_fisher`), which gathers the channel statistics the stand-ins read
in the same forwards when asked (``request.stats``): no second pass over the calibration data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..fisher import fisher_information
from ..fluctuation import StatsCollector
from ..scorer import ScoreRequest, UnitScores
from ..units import unit_fisher


@dataclass(frozen=True)
class FisherScorer:
    """No settings."""

    name: ClassVar[str] = "fisher"
    plan: ClassVar[bool] = True
    pool: ClassVar[bool] = True
    fisher: ClassVar[bool] = True
    label_free: ClassVar[bool] = False

    def score(self, model, batches, request: ScoreRequest) -> UnitScores:
        if request.blocks:
            fisher = fisher_information(model, batches, loss_fn=request.loss_fn, progress=request.progress)
            return UnitScores(dict(fisher.diag), fisher=fisher)
        heads, neurons = request.units != "neurons", request.units != "heads"
        collect = StatsCollector(model, heads=heads, neurons=neurons, gram=request.gram) if request.stats else None
        found = unit_fisher(model, batches, loss_fn=request.loss_fn, heads=heads, neurons=neurons,
                            progress=request.progress, collect=collect)
        return UnitScores(found.heads, found.neurons, stats=collect.finish() if collect is not None else None)
