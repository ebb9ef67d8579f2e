"""Package namespaces whose names are imported on first use (PEP 562), so that importing the package (and
with it ``headprune --version`` or a command's ``--help``) costs no torch until a name that needs it is read."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping


def lazy_names(package: str, sources: Mapping[str, str], names: Iterable[str], namespace: dict,
               subpackages: Iterable[str] = ()) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(``__getattr__``, ``__dir__``) for ``package``: a name of ``sources`` ({public name: submodule}) is
    read from ``package.submodule`` on first use and kept in ``namespace`` (the package's globals);
    a name of ``subpackages`` is that subpackage."""
    subpackages, names = frozenset(subpackages), tuple(names)

    def __getattr__(name: str):
        if name in subpackages:
            return importlib.import_module(f"{package}.{name}")
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sources[name]}"), name)
        namespace[name] = value  # read once
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
