"""``distill``: after the cut (and the refits before it in ``compensate``), every weight of the pruned model
trained for ``epochs`` passes over the fit batches to match the unpruned model's output distribution
(:func:`headprune.compression.distill.distill`; no labels read), kept only where it lowers the validation loss.
The batches' order is shuffled with the settings' ``seed``.

Its settings: ``epochs`` (passes over the fit batches, >= 1) and ``lr`` (the peak learning rate: AdamW, linear
decay to 0); ``--distill-epochs``, ``--distill-lr`` on the CLI (which add it after ``--compensate``'s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...checks import check_int, check_number
from ..distill import distill


@dataclass(frozen=True)
class Distill:
    name: ClassVar[str] = "distill"
    stage: ClassVar[str] = "refit"
    done: ClassVar[str] = "distilled"  # its key among the validation losses
    epochs: int = 1  # passes over the fit batches
    lr: float = 2e-5  # peak learning rate

    def __post_init__(self):
        check_int("epochs", self.epochs, 1)
        check_number("lr", self.lr, low=0, strict=True)

    def apply(self, student, teacher, batches, settings, progress: bool = False) -> dict:
        """Train ``student`` in place; its record (the result's ``distillation``: steps, seconds, lr, epochs, the
        first and last training loss)."""
        info = distill(student, teacher, batches, epochs=self.epochs, lr=self.lr, seed=settings.seed,
                       progress=progress)
        return {k: v for k, v in info.items() if k != "losses"} | {"loss_first": info["losses"][0],
                                                                    "loss_last": info["losses"][-1]}
