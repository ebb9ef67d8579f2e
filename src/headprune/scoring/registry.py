"""The scorers by name: the built-in ones (:mod:`.scorers`) and any :func:`register_scorer` adds.

``PruneSettings(scores=NAME)`` and ``headprune compress --scores NAME`` read the names from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from ..errors import ConfigError
from ..methods import from_spec, spec_of
from .scorer import Scorer
from .scorers import BUILT_IN

_REGISTRY: dict[str, Scorer] = {s.name: s for s in BUILT_IN}  # the registry (name -> default-configured scorer): the names
# settings and the CLI accept; a documented module-level table, added to only by register_scorer


def register_scorer(scorer: Scorer) -> Scorer:
    """Make ``scorer`` available by its ``name`` (to ``PruneSettings(scores=...)`` and ``--scores``); returns it.
    A name already taken by another kind of scorer is refused."""
    check_scorer(scorer)
    old = _REGISTRY.get(scorer.name)
    if old is not None and type(old) is not type(scorer):
        raise ConfigError(f"register_scorer: name {scorer.name!r} is taken by {type(old).__name__}; allowed: a new "
                          "name")
    _REGISTRY[scorer.name] = scorer
    return scorer


def check_scorer(scorer: object) -> Scorer:
    """``scorer`` if it has what :class:`Scorer` declares, else a one-line ConfigError naming what is missing."""
    missing = [a for a in ("name", "plan", "pool", "fisher", "label_free", "score") if not hasattr(scorer, a)]
    name = getattr(scorer, "name", None)
    if missing or not isinstance(name, str) or not name:
        raise ConfigError(f"scores={scorer!r}: not a Scorer (missing {', '.join(missing) or 'a name'}); allowed: "
                          f"{' | '.join(scorer_names())} or an object with name, plan, pool, fisher, label_free and "
                          "score(model, batches, request)")
    return cast(Scorer, scorer)


def get_scorer(scores: str | Mapping | Scorer) -> Scorer:
    """The scorer ``scores`` names (a name, or a spec table ``{"name": ..., setting: value}``: :mod:`headprune.methods`),
    or ``scores`` itself, checked."""
    if isinstance(scores, str):
        if scores not in _REGISTRY:
            raise ConfigError(f"scores={scores!r}; allowed: {', '.join(scorer_names())}")
        return _REGISTRY[scores]
    if isinstance(scores, Mapping):
        return check_scorer(from_spec(scores, _REGISTRY, "scores"))
    return check_scorer(scores)


def scorer_spec(scorer: Scorer) -> str | dict:
    """How ``scorer`` is written down: its name, or ``{"name": ..., setting: value}`` for the settings it has unlike
    the scorer registered under that name (:func:`headprune.methods.spec_of`)."""
    return spec_of(scorer, _REGISTRY)


def scorer_names() -> tuple[str, ...]:
    """The registered names, built-in ones first."""
    return tuple(_REGISTRY)
