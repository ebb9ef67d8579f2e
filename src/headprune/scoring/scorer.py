"""The ``Scorer`` protocol: what a scoring method is to the pipeline (the registry: :mod:`.registry`).

A scorer turns a model and calibration batches into one score per unit (higher = keep): ``{site: [H]}`` for
heads and ``{ffn: [W]}`` for FFN neurons. :class:`~headprune.compression.PruneSettings` takes one by name
(``scores="fisher"``, any name in :func:`~.registry.scorer_names`) or as an object; the CLI's ``--scores`` takes the
registered names. Adding a method is one class (``name``, what it can feed, ``score()``) and one
:func:`~.registry.register_scorer` call: the built-in ones live in :mod:`headprune.scoring.scorers`, one module each.

What a scorer declares, so settings are checked on creation rather than in the middle of a run:

- ``plan``: it can feed the head plan (heads only; GQA modes, ``same_per_site``);
- ``pool``: it can feed the one budget over heads and neurons (it scores FFN neurons too);
- ``fisher``: its :attr:`UnitScores.fisher` holds the Fisher blocks that rearrangement and tuning read;
- ``label_free``: it reads no labels (the default compensation is then one that reads none either).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from .gradients import LossFn


@dataclass
class ScoreRequest:
    """What the pipeline asks a scorer for."""

    units: str = "heads"  # heads | neurons | both: which units to score
    blocks: bool = False  # the per-site Fisher blocks too, where the scorer has them (rearrangement, tuning)
    loss_fn: LossFn | None = None  # the loss of labelled scorers (None: the model's own)
    seed: int = 0  # of seeded scorers
    costs: Any = None  # the pool's per-unit prices (:class:`~headprune.core.model.unit_cost.UnitCosts`), or None
    stats: bool = False  # also the channel statistics (stand-ins read them), where the scorer's pass can gather them
    gram: bool = False  # ... with the features' second moments (linear stand-ins read them)
    progress: bool = False


@dataclass
class UnitScores:
    """One score per unit, higher = keep, and what the scorer computed on the way that later stages reuse."""

    heads: dict[str, torch.Tensor]  # {site: [H]}
    neurons: dict[str, torch.Tensor] = field(default_factory=dict)  # {ffn: [W]}
    fisher: object = None  # :class:`~headprune.scoring.fisher.Fisher` (rearrangement, tuning), or None
    stats: object = None  # :class:`~headprune.scoring.fluctuation.ChannelStats` (stand-ins), or None


@runtime_checkable
class Scorer(Protocol):
    """A scoring method: ``score(model, batches, request)`` -> :class:`UnitScores`."""

    # read-only (properties): frozen dataclasses, the built-in scorers, satisfy the protocol
    @property
    def name(self) -> str: ...
    @property
    def plan(self) -> bool: ...
    @property
    def pool(self) -> bool: ...
    @property
    def fisher(self) -> bool: ...
    @property
    def label_free(self) -> bool: ...

    def score(self, model: nn.Module, batches: list[Mapping[str, torch.Tensor]], request: ScoreRequest) -> UnitScores:
        ...
