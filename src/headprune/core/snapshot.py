"""What makes surgery atomic: a snapshot of everything a cut may change, put back when it fails half way.

Surgery of heads and of neurons replaces parameters, children and classes rather than writing into
them, so shallow copies of each affected module's dictionaries hold the old tensors and modules; the
config's headprune records (:data:`.records.RECORD_KEYS`) are deep-copied.
"""

from __future__ import annotations

import copy

from torch import nn

from .records import RECORD_KEYS


class Snapshot:
    """Every module under ``roots`` (its parameters, children, attributes and class) and ``model.config``'s
    records, as they are now; :meth:`restore` puts them all back."""

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
            module.__dict__.update(_copy_state(state))
            module.__class__ = cls
        for key in RECORD_KEYS:
            if key in self.records:
                setattr(self.config, key, self.records[key])
            elif hasattr(self.config, key):
                delattr(self.config, key)


def _copy_state(state: dict) -> dict:
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in state.items()}
