"""The ``Compensation`` protocol -- what makes up for the units cut -- and the registry of compensations by name.

``PruneSettings(compensate=...)`` takes a name, an object, a spec table (``{"name": "linear", "damping": 0.3}``:
:mod:`headprune.methods`) or a list of them, run in order; the CLI's ``--compensate`` a comma list of registered
names, whose settings its flags set (``--damping``, ``--target``, ...). A compensation is an object with its own
settings: the built-in ones are frozen dataclasses whose fields are their settings, validated in their own
``__post_init__`` (``Tune(damping=1e-2, max_scale=10.0, target="residual")``, ``Linear(variant="obs-seq",
damping=0.01)``); a name stands for the object registered under it, default-configured. A compensation declares
its ``stage``:

- ``"plan"``: ``refine(ctx, plan) -> plan`` refines the head plan before anything is cut, through the guard on
  the calibration loss (``rearrange``, ``tune``: they read the Fisher blocks, so need ``scores="fisher"``;
  :class:`headprune.compression.plan.PlanContext`);
- ``"standin"``: ``apply(pruned, model, stats, dropped_heads, dropped_neurons, settings) -> note`` before the
  cut, from the channel statistics of the calibration batches (``gram``: second moments too): ``bias``,
  ``linear``; at most one. It writes only into the output projections (weights, biases) of the sites and FFNs:
  ``pruned`` shares every other tensor with the model passed (:mod:`.copies`). Returning ``(note, {name: bias shift})`` instead says its whole effect is those
  bias shifts, which the plan then records (replayable);
- ``"refit"``: ``apply(student, teacher, batches, settings, progress) -> rows`` on a copy of the pruned model,
  kept only where the validation loss drops (``done``: its key among the losses): ``reconstruct`` (its rows: the
  result's ``reconstruction``); ``distill``, whose one record (a dict, not rows) is the result's ``distillation``.

Stages run in that order (plan, stand-in, cut, refits in the order given). Adding a method is one class in
its own module and one :func:`register_compensation` call; the built-in ones are in
:mod:`headprune.compression.compensations`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, cast, runtime_checkable

from ..errors import ConfigError
from ..methods import from_spec, spec_of
from .compensations import BUILT_IN

STAGES = ("plan", "standin", "refit")


@runtime_checkable
class Compensation(Protocol):
    # read-only (properties): frozen dataclasses, the built-in compensations, satisfy the protocol; a stage's
    # own methods (``apply``, ``gram``, ``refine``) are checked by check_compensation
    @property
    def name(self) -> str: ...
    @property
    def stage(self) -> str: ...


_REGISTRY: dict[str, Compensation] = {c.name: c for c in BUILT_IN}  # the registry (name -> default-configured
# compensation): the names settings and the CLI accept; a documented module-level table, added to only by
# register_compensation


def register_compensation(compensation: Compensation) -> Compensation:
    """Make ``compensation`` available by its ``name`` (``PruneSettings(compensate=...)``, ``--compensate``)."""
    check_compensation(compensation)
    old = _REGISTRY.get(compensation.name)
    if old is not None and type(old) is not type(compensation):
        raise ConfigError(f"register_compensation: name {compensation.name!r} is taken by {type(old).__name__}; "
                          "allowed: a new name")
    _REGISTRY[compensation.name] = compensation
    return compensation


def check_compensation(c: object) -> Compensation:
    """``c`` if it declares a name, a known stage and what that stage calls, else a one-line ConfigError."""
    stage = getattr(c, "stage", None)
    needs = {"plan": ("refine",), "standin": ("gram", "apply"), "refit": ("apply",)}.get(str(stage))
    name = getattr(c, "name", None)
    missing = ["name"] * (not isinstance(name, str) or not name) + (["stage"] if needs is None else
                                                                   [a for a in needs if not hasattr(c, a)])
    if missing:
        raise ConfigError(f"compensate={c!r}: not a Compensation (missing or bad: {', '.join(missing)}); allowed: "
                          f"{' | '.join(compensation_names())} or an object with name, stage "
                          f"({' | '.join(STAGES)}) and that stage's apply()")
    return cast(Compensation, c)


def get_compensations(compensate) -> tuple[Compensation, ...]:
    """``compensate`` (a name, a spec table, an object, or a list / tuple of them; ``"none"`` or ``[]``: nothing)
    as objects."""
    items = [compensate] if isinstance(compensate, str) or not isinstance(compensate, list | tuple) else compensate
    out = []
    for c in items:
        if isinstance(c, str):
            if c == "none" and len(items) == 1:
                return ()
            if c not in _REGISTRY:
                raise ConfigError(f"compensate={c!r}; allowed: none, {', '.join(compensation_names())}, or a list of "
                                  "them run in order")
            c = _REGISTRY[c]
        elif isinstance(c, Mapping):
            c = from_spec(c, _REGISTRY, "compensate")
        out.append(check_compensation(c))
    return tuple(out)


def compensation_spec(compensation: Compensation) -> str | dict:
    """How ``compensation`` is written down: its name, or ``{"name": ..., setting: value}`` for the settings it has
    unlike the compensation registered under that name (:func:`headprune.methods.spec_of`)."""
    return spec_of(compensation, _REGISTRY)


def compensation_names() -> tuple[str, ...]:
    """The registered names, built-in ones first."""
    return tuple(_REGISTRY)
