"""Files of a run directory, read and written without following symbolic links.

A link planted in a run directory (``units.jsonl -> ~/.bashrc``) must not make a run write through it,
nor a ``results.json`` naming ``/etc/passwd`` make a report read it. Every function here opens with
``O_NOFOLLOW`` and raises :class:`~headprune.errors.ConfigError` naming the file instead.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import ConfigError

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _link_error(path: Path) -> ConfigError:
    return ConfigError(f"{str(path)!r} is a symbolic link; headprune does not follow links in a run directory "
                       "(allowed: a regular file; remove the link)")


def open_fd(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` with ``O_NOFOLLOW``: a link is refused in one line (ConfigError), not followed."""
    path = Path(path)
    try:
        return os.open(path, flags | NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP or (not NOFOLLOW and path.is_symlink()):
            raise _link_error(path) from None
        raise


def check_not_link(path: str | Path) -> None:
    if Path(path).is_symlink():
        raise _link_error(Path(path))


def read_bytes(path: str | Path) -> bytes:
    check_not_link(path)
    fd = open_fd(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def read_text(path: str | Path) -> str:
    return read_bytes(path).decode("utf-8")


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a fresh ``path.tmp`` renamed over it (a reader sees the old file or
    the new one; the rename replaces a link itself, never its target, and a link at ``path`` is refused)."""
    path = Path(path)
    check_not_link(path)
    tmp = path.with_name(path.name + ".tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)  # left by a kill; unlink removes a link, not its target
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def inside(root: str | Path, name: str, what: str = "file") -> Path:
    """``root / name`` when it lies inside ``root`` once links and ``..`` are resolved; else ConfigError."""
    root = Path(root).resolve()
    target = (root / name).resolve()
    if target != root and root not in target.parents:
        raise ConfigError(f"{what} {name!r} lies outside the run directory {str(root)!r}; allowed: a file inside it")
    return target
