"""FLAP (An et al., AAAI 2024) as a peer of the harness: the library's re-implementation
(:mod:`headprune.peers.flap`, its docstring gives the method, the public code it follows and the differences)
turned into the harness's :class:`~peers.plan.Plan`."""

from __future__ import annotations

from torch import nn

from headprune.peers.flap import compensation, flap, flap_scores, standardise  # noqa: F401  (the tests read them here)

from .plan import Plan, peer_plan


def flap_plan(model: nn.Module, batches, budget: float, *, bias: bool = True) -> Plan:
    """FLAP's plan removing ``budget`` of the non-embedding parameters (``bias``: compensate, FLAP's default)."""
    cut = flap(model, batches, budget, bias=bias)
    return peer_plan(model, "flap", cut.heads, cut.neurons, biases={cut.paths[n]: b for n, b in cut.biases.items()},
                     info=cut.info)
