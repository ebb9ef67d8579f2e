"""A method's settings as data: a scorer or compensation object and its *spec*.

Methods (:class:`~headprune.scoring.scorer.Scorer`, :class:`~headprune.compression.compensation.Compensation`)
are frozen dataclasses whose fields are their settings (``Tune(damping=1e-2, max_scale=10.0)``), each validated
in its own ``__post_init__``; what a method *is* (``name``, ``stage``, ``plan`` ...) lives in class variables, not
fields. A registry maps names to default-configured objects. A spec is how a method is written down: its name when
it has the settings of the object registered under that name, else a table ``{"name": ..., field: value}`` of the
fields it sets otherwise -- what ``PruneSettings.to_dict`` records, ``compress.toml`` holds and
``PruneSettings(compensate=[{"name": "linear", "damping": 0.3}])`` takes. A method that is no dataclass has no
settings: its spec is its name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError


def settings_of(method: object) -> dict[str, Any]:
    """{field: value} of a dataclass method's settings ({} for an object that is no dataclass)."""
    if not dataclasses.is_dataclass(method) or isinstance(method, type):
        return {}
    return {f.name: getattr(method, f.name) for f in dataclasses.fields(method) if f.init}


def spec_of(method: Any, registered: Mapping[str, Any]) -> str | dict:
    """``method``'s name, or ``{"name": name, field: value}`` for the fields it sets unlike the object
    ``registered`` under its name (a method registered under no name, or under it as another class: the name)."""
    name = method.name
    base = registered.get(name)
    if base is None or type(base) is not type(method):
        return name
    default = settings_of(base)
    changed = {k: v for k, v in settings_of(method).items() if v != default.get(k)}
    return {"name": name, **changed} if changed else name


def from_spec(spec: Mapping, registered: Mapping[str, Any], what: str) -> Any:
    """The object a table spec ``{"name": ..., field: value}`` names: the one ``registered`` under ``name``
    with those fields set (validated by its class); ``what``: the setting it was given to, for messages."""
    name = spec.get("name")
    if not isinstance(name, str) or name not in registered:
        raise ConfigError(f"{what}={dict(spec)!r}; allowed: a table with name = {' | '.join(registered)} and that "
                          "method's settings")
    base = registered[name]
    own = settings_of(base)
    unknown = sorted(set(spec) - {"name"} - set(own))
    if unknown:
        raise ConfigError(f"{what}={dict(spec)!r}: {name} has no setting {', '.join(unknown)}; allowed: "
                          f"{', '.join(own) or 'none'}")
    return dataclasses.replace(base, **{k: v for k, v in spec.items() if k != "name"})


def with_settings(method: Any, values: Mapping[str, Any]) -> Any:
    """``method`` with those of ``values`` (not None) that are fields of its class set; the others left."""
    own = settings_of(method)
    given = {k: v for k, v in values.items() if v is not None and k in own}
    return dataclasses.replace(method, **given) if given else method
