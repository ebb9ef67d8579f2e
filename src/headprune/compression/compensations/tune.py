"""``tune``: rearrangement, then the kept heads' scales fitted per site by damped least squares and folded into
the output projections (Kwon et al. 2022; :func:`headprune.compression.tuning.tune_scales`), each step guarded on
the calibration loss. A stage of the head plan; needs ``scores="fisher"``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tune:
    name: str = "tune"
    stage: str = "plan"
    rearranges: bool = True  # tuning implies rearrangement
    tunes: bool = True
