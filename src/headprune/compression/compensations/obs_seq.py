"""``obs-seq``: ``linear-seq``, with the units each site and FFN loses re-chosen on the pruned model's inputs.

The scorer's selection sets how many heads each key/value group and how many neurons each FFN lose, over the whole
model under one budget. Block after block (:mod:`headprune.compression.blockwise`, as ``linear-seq``), on the
inputs the already compensated and cut blocks below hand it, the units themselves are re-chosen greedily by the
output error their removal leaves once the kept ones are refitted (the structured OBS error of SlimGPT and OSSCAR;
:mod:`headprune.compression.reselect`), then the removed ones get ``linear-seq``'s stand-ins. The scores decide
where the budget goes; the layer's own second-order error decides what goes within it. Needs the blocks to be
replayable one at a time (refused elsewhere); not guarded.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.standins import linear_standins


@dataclass(frozen=True)
class ObsSequential:
    name: str = "obs-seq"
    stage: str = "standin"
    gram: bool = True  # needs the features' second moments
    sequential: bool = True  # fitted block by block on the pruned model's inputs (compression.blockwise)
    reselect: bool = True  # the units within each site / FFN re-chosen there (compression.reselect)

    def apply(self, pruned, model, stats, dropped_heads, dropped_neurons, settings) -> str:
        linear_standins(pruned, stats.mean, stats.second, dropped_heads, dropped_neurons, damping=settings.damping)
        return ("kept (unguarded: the units within each site and FFN re-chosen by their OBS error, then replaced by "
                "their least-squares affine prediction from the kept ones, block by block on the pruned model's inputs)")
