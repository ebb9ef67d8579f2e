"""``random``: seeded uniform scores per head (a baseline); heads only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...core.model.finite import check_finite_weights
from ...core.model.sites import find_sites
from ...errors import ConfigError
from ..scorer import ScoreRequest, UnitScores


@dataclass(frozen=True)
class RandomScorer:
    """No settings."""

    name: ClassVar[str] = "random"
    plan: ClassVar[bool] = True
    pool: ClassVar[bool] = False
    fisher: ClassVar[bool] = False
    label_free: ClassVar[bool] = True

    def score(self, model, batches, request: ScoreRequest) -> UnitScores:
        if request.units != "heads":
            raise ConfigError(f"scores='random' with units={request.units!r}; allowed: units='heads'")
        check_finite_weights(model)  # a baseline for a model that computes NaN would be one in silence
        g = torch.Generator().manual_seed(request.seed)
        return UnitScores({s.name: torch.rand(s.num_heads, generator=g, dtype=torch.float64)
                           for s in find_sites(model)})
