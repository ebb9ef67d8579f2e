"""``select_heads``: the one way to turn scores into the heads to drop, under any budget.

Lowest scores go first, under one :class:`~.budgets.Budget`: ``n_drop`` / ``fraction`` (heads dropped),
``keep`` / ``n_keep`` (heads kept), ``flops`` (share of the head FLOPs kept, priced by ``costs``) or ``kv``
(share of the KV-cache bytes kept, priced by ``costs``), spent as a :class:`~.budgets.HeadRule` says.
``groups`` ({site: the key/value head each query head reads}, :func:`.gqa.kv_groups`) lets the default
``HeadRule(gqa="uniform")`` keep grouped-query attention even -- the same number of query heads per
key/value group, so the KV cache never grows; ``"groups"`` drops whole key/value groups, ``"free"`` any
heads (it warns when the cache grows). :func:`.lowest.lowest_heads` is the paper's plain rule (the lowest
heads wherever they are), kept beside it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..core.cut.surgery import DroppedHeads
from ..core.model.cost import HeadCosts
from ..errors import ConfigError
from .budgets import Budget, HeadRule, check_budget
from .gqa import Groups, select_gqa


def select_heads(
    scores: Mapping[str, torch.Tensor],
    groups: Groups | None,
    budget: Budget,
    rule: HeadRule = HeadRule(),
    costs: HeadCosts | Mapping[str, torch.Tensor] | Mapping[str, float] | None = None,
) -> DroppedHeads:
    """Heads to drop ({site: sorted indices}) under ``budget`` (:class:`Budget`, e.g. ``Budget.of(fraction=0.5)``)
    and ``rule`` (:class:`HeadRule`); see the module doc.

    ``groups``: :func:`headprune.kv_groups` ``(model)``, or None for a model without grouped-query
    attention (the paper's plain head-by-head rule: :func:`headprune.lowest_heads`;
    :func:`headprune.selection.budget.budget_heads` for a FLOP budget). ``costs``: what the budget's price
    counts -- for ``flops``, :func:`headprune.core.model.cost.head_costs` ``(model)`` or plain {site: [H]} per-head
    costs; for ``kv``, :func:`headprune.core.model.kvcache.kv_head_bytes` ``(model)``; None for a head count.
    Non-finite scores are refused.
    """
    _check_finite(scores)
    if check_budget(budget, "count", "flops", "kv").price == "flops" and costs is not None \
            and not isinstance(costs, HeadCosts):
        if not isinstance(costs, Mapping):
            raise ConfigError(f"costs: {type(costs).__name__}; allowed: HeadCosts or a mapping site -> [heads]")
        costs = HeadCosts.additive(costs)
    return select_gqa(scores, groups, budget, rule, costs)


def _check_finite(scores: Mapping[str, torch.Tensor]) -> None:
    """Scores that order heads: a NaN or infinite score orders nothing (all-NaN scores would drop the first heads)."""
    if not isinstance(scores, Mapping):
        raise ConfigError(f"scores: {type(scores).__name__}; allowed: a mapping site -> one score per head")
    for name, s in scores.items():
        values = torch.as_tensor(s, dtype=torch.float64).flatten()
        bad = (~torch.isfinite(values)).nonzero().flatten().tolist()
        if bad:
            raise ConfigError(f"scores[{name!r}] holds {len(bad)} non-finite values (head {bad[0]}: "
                              f"{values[bad[0]].item()}); allowed: finite scores (rescore; a NaN score orders nothing)")
