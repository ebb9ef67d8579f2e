"""The copy of the model that compression works on, sharing what no stage writes into with the model passed.

``compress`` leaves the model passed unchanged and returns another. Before the cut, the stages write only into
the output projections of the sites and FFNs (a site's output projection, an FFN's down projection: stand-ins
fold into their weights and biases, the head plan's scales into their columns), and surgery replaces the tensors
it cuts rather than writing into them (:mod:`headprune.core.cut.snapshot`). So :func:`working_copy` copies the
output projections only and shares every other tensor -- embeddings, output head, norms, the inputs'
projections -- with the model passed: a Gemma-3 270M's 262,144 x 640 embedding (63% of its weights) is not held
twice while the stand-ins' second moments are. Once the plan is made, :func:`owning` gives the result its own
copy of what it still shares, so that writing into it later (fine-tuning) leaves the model passed as it was.
A stand-in that wrote into any other tensor would write into the model passed: the protocol
(:mod:`.compensation`) allows the output projections only.
"""

from __future__ import annotations

from torch import nn

from ..core.cut.biases import output_projections
from ..core.cut.snapshot import shared_copy, tensors


def working_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its own output projections (sites' and FFNs'), every other tensor shared."""
    written = {id(t) for module in output_projections(model).values() for t in tensors(module)}
    return shared_copy(model, [t for t in tensors(model) if id(t) not in written])


def owning(model: nn.Module, other: nn.Module) -> nn.Module:
    """``model``, or a copy of it holding its own copy of every tensor it shares with ``other`` (new modules; no
    other bytes copied)."""
    theirs = {id(t) for t in tensors(other)}
    mine = tensors(model)
    if not any(id(t) in theirs for t in mine):
        return model
    return shared_copy(model, [t for t in mine if id(t) not in theirs])
