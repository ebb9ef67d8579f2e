"""``fisher``: the diagonal empirical Fisher of the unit masks, sum over examples of (dL_b/dxi_u)^2.

For the head plan the full per-site Fisher blocks too (:func:`headprune.scoring.fisher.fisher_information`:
rearrangement and tuning read them); for the budget over heads and neurons, heads and neurons in one backward
per batch (:func:`headprune.scoring.units.unit_fisher`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..fisher import fisher_information
from ..scorer import ScoreRequest, UnitScores
from ..units import unit_fisher


@dataclass(frozen=True)
class FisherScorer:
    name: str = "fisher"
    plan: bool = True
    pool: bool = True
    fisher: bool = True
    label_free: bool = False

    def score(self, model, batches, request: ScoreRequest) -> UnitScores:
        if request.head_plan:
            fisher = fisher_information(model, batches, loss_fn=request.loss_fn, progress=request.progress)
            return UnitScores(dict(fisher.diag), fisher=fisher)
        found = unit_fisher(model, batches, loss_fn=request.loss_fn, heads=request.units != "neurons",
                            neurons=request.units != "heads", progress=request.progress)
        return UnitScores(found.heads, found.neurons)
