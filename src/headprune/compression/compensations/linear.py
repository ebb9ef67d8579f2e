"""``linear``, ``linear-seq``, ``obs-seq``: every removed unit replaced by its least-squares affine prediction from
the kept ones, folded into the kept columns and the biases (:func:`headprune.core.cut.standins.linear_standins`). One
class; the three names are three settings of it. Runs before the cut, on the channel means and second moments;
not guarded (the fit is exact on the calibration tokens).

- ``linear`` (``sequential=False``): fitted on the inputs the unpruned model gives each projection, in the
  scoring pass's statistics.
- ``linear-seq`` (``sequential=True``): at large budgets the pruned model feeds its later blocks something else,
  and each stand-in would be fitted to inputs the model no longer sees. The blocks are visited in order
  (:mod:`headprune.compression.blockwise`): block ``l``'s moments are gathered on what blocks ``0..l-1``, already
  compensated and cut, hand it; its stand-ins are folded; its removed columns zeroed; its outputs go on -- the
  sequential scheme of SparseGPT and SlimGPT, with headprune's selection. About two forwards of extra work; it
  needs blocks replayable one at a time (decoder stacks; refused elsewhere).
- ``obs-seq`` (``sequential=True, reselect=True``): as ``linear-seq``, and the units each site and FFN loses
  re-chosen there greedily by the output error their removal leaves once the kept ones are refitted (the
  structured OBS error of SlimGPT and OSSCAR; :mod:`headprune.compression.reselect`): the scores decide where the
  budget goes, the layer's own second-order error what goes within it.

``damping``: the ridge, relative to the kept features' mean variance (None: the settings' ``damping``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...checks import check_number
from ...core.cut.standins import linear_standins
from ...errors import ConfigError

_NOTES = {(False, False): "removed units replaced by their least-squares affine prediction from the kept ones on "
                          "the calibration tokens",
          (True, False): "removed units replaced by their least-squares affine prediction from the kept ones, fitted "
                         "block by block on the pruned model's inputs",
          (True, True): "the units within each site and FFN re-chosen by their OBS error, then replaced by their "
                        "least-squares affine prediction from the kept ones, block by block on the pruned model's "
                        "inputs"}


@dataclass(frozen=True)
class Linear:
    name: str = "linear"
    stage: str = "standin"
    gram: bool = True  # needs the kept features' second moments
    sequential: bool = False  # fitted block by block on the pruned model's inputs (compression.blockwise)
    reselect: bool = False  # the units within each site / FFN re-chosen there (compression.reselect); sequential
    damping: float | None = None  # the ridge, relative (None: the settings' damping)

    def __post_init__(self):
        check_number("damping", self.damping, low=0, optional=True)
        if self.reselect and not self.sequential:
            raise ConfigError(f"{self.name}: reselect=True with sequential=False; allowed: reselect only on the pruned "
                              "model's inputs (sequential=True)")

    def ridge(self, settings) -> float:
        """The damping this stand-in fits with."""
        return settings.damping if self.damping is None else self.damping

    def apply(self, pruned, model, stats, dropped_heads, dropped_neurons, settings) -> str:
        linear_standins(pruned, stats.mean, stats.second, dropped_heads, dropped_neurons,
                        damping=self.ridge(settings))
        return f"kept (unguarded: {_NOTES[self.sequential, self.reselect]})"


LINEAR_SEQ = Linear(name="linear-seq", sequential=True)
OBS_SEQ = Linear(name="obs-seq", sequential=True, reselect=True)
