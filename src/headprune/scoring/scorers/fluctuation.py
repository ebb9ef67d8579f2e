"""``fluctuation`` / ``fluctuation-raw``: FLAP's input fluctuation of each unit (one forward pass, no labels).

``fluctuation`` standardises it per kind over all layers and makes it a knapsack value per price, as FLAP
ranks heads and neurons together (:func:`~headprune.scoring.fluctuation.knapsack_scores`);
``fluctuation-raw`` keeps the expected squared output change of holding each unit at its mean, an additive
score the budget trades against price like the Fisher's. The channel statistics come along for the
stand-ins (:mod:`headprune.core.cut.biases`, :mod:`headprune.core.cut.standins`). One class: the two names are the two
values of its setting ``standardise``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...errors import ConfigError
from ..fluctuation import fluctuation_scores, knapsack_scores
from ..scorer import ScoreRequest, UnitScores


@dataclass(frozen=True)
class FluctuationScorer:
    plan: ClassVar[bool] = False
    pool: ClassVar[bool] = True
    fisher: ClassVar[bool] = False
    label_free: ClassVar[bool] = True
    standardise: bool = True  # fluctuation (standardised per kind, a knapsack value per price) | fluctuation-raw

    def __post_init__(self):
        if not isinstance(self.standardise, bool):
            raise ConfigError(f"standardise={self.standardise!r}; allowed: True (fluctuation) or False "
                              "(fluctuation-raw)")

    @property
    def name(self) -> str:
        return "fluctuation" if self.standardise else "fluctuation-raw"

    def score(self, model, batches, request: ScoreRequest) -> UnitScores:
        found = fluctuation_scores(model, batches, heads=request.units != "neurons", neurons=request.units != "heads",
                                   gram=request.gram, progress=request.progress)
        if not self.standardise:
            return UnitScores({k: found.raw[k] for k in found.heads}, {k: found.raw[k] for k in found.neurons},
                              stats=found.stats)
        if request.costs is None:
            raise ConfigError("scores='fluctuation' needs the pool's prices (request.costs) to rank heads and neurons")
        floor = min(float(v.min()) for v in (*found.heads.values(), *found.neurons.values()))
        return UnitScores(knapsack_scores(found.heads, request.costs.heads, floor),
                          knapsack_scores(found.neurons, request.costs.neurons, floor), stats=found.stats)
