"""``reconstruct``: after the cut, every pruned output / down projection refitted by least squares to reproduce
the unpruned model (:func:`headprune.compression.reconstruct.reconstruct`), kept only where it lowers the
validation loss.

Its settings: ``damping`` (ridge towards the unpruned solution, relative) and ``target`` (what each projection
reproduces: the residual stream after it, or its own output); ``--damping``, ``--target`` on the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...checks import check_choice, check_number
from ..reconstruct import reconstruct
from ..tuning import TARGETS


@dataclass(frozen=True)
class Reconstruct:
    name: ClassVar[str] = "reconstruct"
    stage: ClassVar[str] = "refit"
    done: ClassVar[str] = "reconstructed"  # its key among the validation losses
    damping: float = 1e-2  # ridge towards the unpruned solution, relative
    target: str = "residual"  # residual | output: what each projection reproduces

    def __post_init__(self):
        check_number("damping", self.damping, low=0)
        check_choice("target", self.target, TARGETS)

    def apply(self, student, teacher, batches, settings, progress: bool = False) -> list[dict]:
        """The refit of ``student`` in place; its rows (per projection, the result's ``reconstruction``)."""
        return reconstruct(student, teacher, batches, damping=self.damping, target=self.target, progress=progress)
