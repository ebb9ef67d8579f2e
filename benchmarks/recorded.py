"""What a benchmark's results file records of where it ran: ``python benchmarks/X.py ARGS``, every path in it
relative to the repository root (the shared data beside it, ``../shared/data``, included) or else by its own name --
never this machine's folders or its virtual environment's python (``tests/test_no_machine_paths.py`` scans
the committed files)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def repo_path(path: str | Path) -> str:
    """An absolute path relative to the repository root (``/work/repo/runs/m`` -> ``runs/m``; the workplace's shared
    data beside the clone, ``/work/shared/data`` -> ``../shared/data``), else by its own name (``/tmp/x/cache`` ->
    ``cache``, whether or not the clone is in ``/tmp`` too); anything else unchanged."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    relative = Path(os.path.relpath(text, ROOT))
    if ".." not in relative.parts or relative.parts[:2] == ("..", "shared"):  # in the clone, or the shared data
        return relative.as_posix()
    return Path(text).name or text  # elsewhere (a temporary folder beside the clone too): its own name


def repo_word(word: str) -> str:
    """A command-line word with its path made relative (also ``--flag=/abs/path``)."""
    flag, eq, rest = word.partition("=")
    if eq and flag.startswith("-"):
        return f"{flag}={repo_path(rest)}"
    return repo_path(word)


def command(script: str | Path, argv: Sequence[str] | None = None) -> str:
    """``python benchmarks/X.py ARGS`` (shell-quoted) for the script file ``script`` (its ``__file__``) and its
    arguments (default: this process's)."""
    given = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", repo_path(Path(script).resolve()), *(repo_word(str(a)) for a in given)])


def opening(name: str, script: str | Path, argv: Sequence[str] | None = None, *, threads: int | None = None,
            load: bool = True, python: bool = False, label: str = "name") -> dict:
    """The opening every benchmark's results file shares, ``{"name", "command", "machine", "versions"}``: the
    command (:func:`command` of ``script`` and ``argv``), the machine (``headprune.bench.machine_info``, with the
    1-minute load at the start when ``load``), headprune's and its dependencies' versions (with python's when
    ``python``). ``threads``: torch's intra-op threads set to it first (None: left as they are). ``label``: the
    key ``name`` goes under (``"benchmark"`` in the older results files)."""
    import platform

    import torch

    from headprune.bench.machine import loadavg, machine_info
    from headprune.provenance import versions

    if threads is not None:
        torch.set_num_threads(threads)
    machine = machine_info() | ({"loadavg_at_start": loadavg()} if load else {})
    return {label: name, "command": command(script, argv), "machine": machine,
            "versions": versions() | ({"python": platform.python_version()} if python else {})}
