"""``reconstruct``: after the cut, every pruned output / down projection refitted by least squares to reproduce
the unpruned model (:func:`headprune.compression.reconstruct.reconstruct`; ``settings.damping``,
``settings.target``), kept only where it lowers the validation loss."""

from __future__ import annotations

from dataclasses import dataclass

from ..reconstruct import reconstruct


@dataclass(frozen=True)
class Reconstruct:
    name: str = "reconstruct"
    stage: str = "refit"
    done: str = "reconstructed"  # its key among the validation losses

    def apply(self, student, teacher, batches, settings, progress: bool = False) -> list[dict]:
        return reconstruct(student, teacher, batches, damping=settings.damping, target=settings.target,
                           progress=progress)
