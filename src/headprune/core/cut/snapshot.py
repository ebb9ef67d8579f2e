"""What makes surgery atomic: a snapshot of everything a cut may change, put back when it fails half way.

Surgery of heads and of neurons replaces parameters, children and classes rather than writing into
them, so shallow copies of each affected module's dictionaries hold the old tensors and modules; the
config's headprune records (:data:`.records.RECORD_KEYS`) are deep-copied. For the same reason
:func:`shared_copy` -- new modules, the very same tensors -- can be cut without touching the model it copies.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

from ..model.records import RECORD_KEYS


def tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer object of ``model``, each once (tied ones once)."""
    return [*model.parameters(), *model.buffers()]


def shared_copy(model: nn.Module, shared: Iterable[torch.Tensor] | None = None) -> nn.Module:
    """A deep copy of ``model`` (modules, config, attributes) that holds the very tensor objects ``shared`` of
    ``model`` (default: all its parameters and buffers) and copies the rest; tied tensors stay tied. Surgery
    (heads, neurons, zero biases) on it leaves ``model`` as it was, since surgery replaces tensors; anything that
    writes into a shared tensor writes into ``model``'s."""
    memo: dict[int, object] = {id(t): t for t in (tensors(model) if shared is None else shared)}
    return copy.deepcopy(model, memo)


class Snapshot:
    """Every module under ``roots`` (its parameters, children, attributes and class) and ``model.config``'s
    records, as they are now; :meth:`restore` puts them all back. A module's dictionaries (``_parameters``,
    ``_modules``, its hooks) come back as the very objects they were, refilled: a hook's handle removes it
    from the dictionary it was registered in."""

    def __init__(self, model: nn.Module, roots: list[nn.Module]):
        modules: dict[int, nn.Module] = {}
        for root in roots:
            modules.update({id(m): m for m in root.modules()})
        self.modules = [(m, m.__class__, _copy_state(m.__dict__)) for m in modules.values()]
        self.config = model.config
        self.records = {k: copy.deepcopy(getattr(model.config, k)) for k in RECORD_KEYS if hasattr(model.config, k)}

    def restore(self) -> None:
        for module, cls, state in self.modules:
            module.__dict__.clear()
            module.__dict__.update(_refilled(state))
            module.__class__ = cls
        for key in RECORD_KEYS:
            if key in self.records:
                setattr(self.config, key, self.records[key])
            elif hasattr(self.config, key):
                delattr(self.config, key)


class _Saved:
    """A module's dictionary as it was: the object, and a shallow copy of its items."""

    def __init__(self, d: dict):
        self.d, self.items = d, dict(d)

    def refilled(self) -> dict:
        self.d.clear()
        self.d.update(self.items)
        return self.d


def _copy_state(state: dict) -> dict:
    return {k: (_Saved(v) if isinstance(v, dict) else v) for k, v in state.items()}


def _refilled(saved: dict) -> dict:
    return {k: (v.refilled() if isinstance(v, _Saved) else v) for k, v in saved.items()}
