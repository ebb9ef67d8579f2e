"""``ih``: the paper's head importance I_h (Michel et al. 4.1), l2-normalised per site; heads only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...errors import ConfigError
from ..importance import head_importance
from ..scorer import ScoreRequest, UnitScores


@dataclass(frozen=True)
class IhScorer:
    """No settings."""

    name: ClassVar[str] = "ih"
    plan: ClassVar[bool] = True
    pool: ClassVar[bool] = False
    fisher: ClassVar[bool] = False
    label_free: ClassVar[bool] = False

    def score(self, model, batches, request: ScoreRequest) -> UnitScores:
        if request.units != "heads":
            raise ConfigError(f"scores='ih' with units={request.units!r}; allowed: units='heads'")
        return UnitScores(head_importance(model, batches, loss_fn=request.loss_fn, progress=request.progress))
