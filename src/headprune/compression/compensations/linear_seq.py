"""``linear-seq``: the linear stand-ins of ``linear`` fitted block after block on the *pruned* model's inputs.

``linear`` fits every removed unit's affine prediction on the inputs the unpruned model gives its projection. At
large budgets the pruned model feeds its later blocks something else, and each stand-in is fitted to inputs the
model no longer sees. ``linear-seq`` visits the blocks in order (:mod:`headprune.compression.blockwise`): the
moments of block ``l``'s projections are gathered on what blocks ``0..l-1``, already compensated and cut, hand it;
its stand-ins are folded; its removed columns are zeroed (what the cut computes); its outputs go on. Each fit
minimises the block's output change on the inputs it will receive -- the sequential scheme of SparseGPT and
SlimGPT, with headprune's selection. About two forwards of extra work; it needs the blocks to be replayable one at
a time (decoder stacks; refused elsewhere). Not guarded, like ``linear``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.standins import linear_standins


@dataclass(frozen=True)
class LinearSequential:
    name: str = "linear-seq"
    stage: str = "standin"
    gram: bool = True  # needs the kept features' second moments
    sequential: bool = True  # fitted block by block on the pruned model's inputs (compression.blockwise)

    def apply(self, pruned, model, stats, dropped_heads, dropped_neurons, settings) -> str:
        linear_standins(pruned, stats.mean, stats.second, dropped_heads, dropped_neurons, damping=settings.damping)
        return ("kept (unguarded: removed units replaced by their least-squares affine prediction from the kept ones, "
                "fitted block by block on the pruned model's inputs)")
