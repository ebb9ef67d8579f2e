"""The guard every compression stage passes through: the loss before and after the stage on the guard's data,
the stage kept only where it is no higher, and the verdict written in the stage log.

Compensations optimise proxies (a second-order loss estimate, a per-site or per-projection reconstruction, a
distillation loss) that can disagree with the model's loss when many units go. One :class:`Guard` per data set
measures the mean loss of the state before a stage and of the candidate after it (each state once, by its key:
``selected``, ``rearranged``, ``tuned`` on the calibration batches for the head plan's refinements, which need no
held-out data since they only choose among the units selected; ``pruned``, ``reconstructed``, ``distilled`` on
held-out validation batches for what fits weights after the cut), keeps the candidate unless its loss is higher,
and records ``stage -> note`` in :attr:`Guard.stages` and ``key -> loss`` in :attr:`Guard.losses`. Stages that are
not guarded (selection, an exact stand-in, the cut) are written in the same log with :meth:`Guard.note`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..core.masks.masking import HeadMask
from ..scoring.gradients import LossFn, mean_loss


@dataclass
class State:
    """A model state the guard can measure: its ``key`` in the losses, the model, and the head mask it runs under
    (None: the model as it is)."""

    key: str
    model: nn.Module
    mask: HeadMask | None = None


@dataclass
class Guard:
    """Keeps a stage only where the mean loss on ``batches`` does not rise (``enabled=False``: every stage kept)."""

    batches: list[Mapping[str, torch.Tensor]]  # the guard's data
    on: str  # what they are, for the log: "calibration" | "validation"
    loss_fn: LossFn | None = None
    enabled: bool = True
    stages: dict[str, str] = field(default_factory=dict)  # the stage log: stage -> "kept" | "rejected (...)" | ...
    losses: dict[str, float] = field(default_factory=dict)  # the mean loss of each state measured, by key
    seconds: float = 0.0  # spent measuring

    def note(self, stage: str, text: str) -> None:
        """Record ``stage`` without judging it (selection, the cut, an exact stand-in)."""
        self.stages[stage] = text

    def measure(self, state: State) -> float:
        """The mean loss of ``state`` on the guard's data (measured once per key)."""
        if state.key not in self.losses:
            start = time.perf_counter()
            self.losses[state.key] = mean_loss(state.model, self.batches, mask=state.mask, loss_fn=self.loss_fn)
            self.seconds += time.perf_counter() - start
        return self.losses[state.key]

    def judge(self, stage: str, before: State, after: State) -> bool:
        """Whether ``stage`` (``before`` -> ``after``) is kept: measured unless the guard is off, logged either way."""
        if not self.enabled:
            self.note(stage, "kept (unguarded)")
            return True
        old, new = self.measure(before), self.measure(after)
        if new <= old:
            self.note(stage, "kept")
            return True
        self.note(stage, f"rejected ({self.on} loss {new:.4f} > {old:.4f} without it)")
        return False

    @property
    def rejected(self) -> list[str]:
        """The stages turned down, in order."""
        return [s for s, note in self.stages.items() if note.startswith("rejected")]
