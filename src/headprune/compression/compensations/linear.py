"""``linear``, ``linear-seq``, ``obs-seq``: every removed unit replaced by its least-squares affine prediction from
the kept ones, folded into the kept columns and the biases (:func:`headprune.core.cut.standins.linear_standins`). One
class; the three names are three values of its ``variant``. Runs before the cut, on the channel means and second moments;
not guarded (the fit is exact on the calibration tokens).

- ``linear``: fitted on the inputs the unpruned model gives each projection, in the
  scoring pass's statistics.
- ``linear-seq``: at large budgets the pruned model feeds its later blocks something else,
  and each stand-in would be fitted to inputs the model no longer sees. The blocks are visited in order
  (:mod:`headprune.compression.blockwise`): block ``l``'s moments are gathered on what blocks ``0..l-1``, already
  compensated and cut, hand it; its stand-ins are folded; its removed columns zeroed; its outputs go on -- the
  sequential scheme of SparseGPT and SlimGPT, with headprune's selection. About two forwards of extra work; it
  needs blocks replayable one at a time (decoder stacks; refused elsewhere).
- ``obs-seq``: as ``linear-seq``, and the units each site and FFN loses
  re-chosen there greedily by the output error their removal leaves once the kept ones are refitted (the
  structured OBS error of SlimGPT and OSSCAR; :mod:`headprune.compression.reselect`): the scores decide where the
  budget goes, the layer's own second-order error what goes within it.

Its settings: ``variant`` (``linear`` | ``linear-seq`` | ``obs-seq``: its name) and ``damping`` (the ridge,
relative to the kept features' mean variance); ``--damping`` on the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...checks import check_choice, check_number
from ...core.cut.standins import linear_standins

VARIANTS = ("linear", "linear-seq", "obs-seq")
_NOTES = {"linear": "removed units replaced by their least-squares affine prediction from the kept ones on the "
                    "calibration tokens",
          "linear-seq": "removed units replaced by their least-squares affine prediction from the kept ones, fitted "
                        "block by block on the pruned model's inputs",
          "obs-seq": "the units within each site and FFN re-chosen by their OBS error, then replaced by their "
                     "least-squares affine prediction from the kept ones, block by block on the pruned model's "
                     "inputs"}


@dataclass(frozen=True)
class Linear:
    stage: ClassVar[str] = "standin"
    gram: ClassVar[bool] = True  # needs the kept features' second moments
    variant: str = "linear"  # linear | linear-seq (fitted block by block on the pruned model's inputs) | obs-seq
    # (linear-seq, the units within each site / FFN first re-chosen there: compression.reselect)
    damping: float = 1e-2  # the ridge, relative to the kept features' mean variance

    def __post_init__(self):
        check_choice("variant", self.variant, VARIANTS)
        check_number("damping", self.damping, low=0)

    @property
    def name(self) -> str:
        return self.variant

    @property
    def sequential(self) -> bool:
        """Fitted block by block on the pruned model's inputs (:mod:`headprune.compression.blockwise`)."""
        return self.variant != "linear"

    @property
    def reselect(self) -> bool:
        """The units within each site / FFN re-chosen there (:mod:`headprune.compression.reselect`)."""
        return self.variant == "obs-seq"

    def apply(self, pruned, model, stats, dropped_heads, dropped_neurons, settings) -> str:
        linear_standins(pruned, stats.mean, stats.second, dropped_heads, dropped_neurons, damping=self.damping)
        return f"kept (unguarded: {_NOTES[self.variant]})"
