"""What a result was made with, for every run signature (one place, not one per stage).

:func:`versions`: the packages results depend on. :func:`code_identity`: this package's version, git
commit when it is known and a hash of its source files. :func:`model_sha256` / :func:`data_sha256`:
content hashes (streamed sha256) of a model directory's weights, config and tokenizer files and of data
files or directories, so a run is identified by what it read, not by where it read it. :func:`own_name` /
:func:`portable`: what files written for others (signatures, GGUF metadata) say instead of this machine's
absolute paths -- a model's own name, a path relative to the working directory.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as md
import json
import os
import platform
import subprocess
from pathlib import Path

__version__ = "0.3.0"

PACKAGES = ("headprune", "torch", "transformers", "tokenizers", "safetensors", "sacrebleu", "scipy", "numpy")
CHUNK = 1 << 20
# files of a model directory that do not change what the model computes (training state, run outputs)
NOT_MODEL = {"optimizer.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
             "training_args.bin", "train_log.jsonl", "run.json", "units.jsonl", "compress.json", "results.json",
             "report.html", "heads.csv", "README.md", "run.lock", "plan.json", "plan.safetensors"}
NOT_MODEL_SUFFIXES = (".png", ".html", ".md", ".tmp", ".lock", ".csv")


def versions() -> dict[str, str]:
    """{package: installed version, or "absent"} for the packages results depend on, and Python's."""
    out = {}
    for package in PACKAGES:
        if package == "headprune":  # this code's own version (an editable install's metadata may be older)
            out[package] = __version__
            continue
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = "absent"
    out["python"] = platform.python_version()
    return out


@functools.lru_cache(maxsize=1)
def code_identity() -> dict:
    """{version, commit (git, or None when unknown), source_sha256 (this package's .py files)}."""
    package = Path(__file__).resolve().parent
    return {"version": __version__, "commit": _git_commit(package) or _installed_commit(),
            "source_sha256": tree_sha256(package, pattern="*.py")}


def _git_commit(package: Path) -> str | None:
    """HEAD of the git checkout holding the package's source (an editable install), else None."""
    try:
        top = subprocess.run(["git", "-C", str(package), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    if len(top) != 2 or not (Path(top[0]) / "pyproject.toml").is_file():
        return None  # a git repository around an installed copy is not this code's history
    return top[1]


def _installed_commit() -> str | None:
    """The commit pip recorded when the package was installed from a git URL (PEP 610), else None."""
    try:
        text = md.distribution("headprune").read_text("direct_url.json")
    except md.PackageNotFoundError:
        return None
    try:
        return (json.loads(text or "{}").get("vcs_info") or {}).get("commit_id")
    except json.JSONDecodeError:
        return None


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in chunks (any size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tree_sha256(root: str | Path, *, pattern: str = "*", keep=lambda path: True, recursive: bool = True) -> str:
    """sha256 over the files under ``root`` matching ``pattern`` (relative path and bytes of each, sorted)."""
    root = Path(root)
    digest = hashlib.sha256()
    found = root.rglob(pattern) if recursive else root.glob(pattern)
    for path in sorted(p for p in found if p.is_file() and "__pycache__" not in p.parts and keep(p)):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file_sha256(path).encode())
    return digest.hexdigest()


def data_sha256(path: str | Path) -> str | None:
    """Content hash of a data file, or of every file of a data directory (e.g. a datasets save_to_disk);
    None for what is not a path (``builtin:pydoc``: the text ships with this Python, named by its version)."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    if path.is_dir():
        return tree_sha256(path)
    return None


def model_sha256(model_dir: str | Path) -> str:
    """Content hash of a model directory's weights, config and tokenizer files (its top-level files but
    training state and run outputs: optimizer, trainer state, reports)."""
    root = Path(model_dir)
    return tree_sha256(root, recursive=False,
                       keep=lambda p: p.name not in NOT_MODEL and not p.name.endswith(NOT_MODEL_SUFFIXES))


def own_name(path: str | Path) -> str:
    """A model's (or file's) own name: the base name of its directory or file, e.g. ``/home/me/runs/tiny`` ->
    ``tiny`` (``.`` -> the working directory's name). What a file written for others calls it, never where it was."""
    name = Path(path).name
    return name if name not in ("", ".", "..") else Path(path).resolve().name


def portable_path(path: str | Path) -> str:
    """An absolute path as a file written for others holds it: relative to the working directory when it lies
    beneath it (``/work/repo/data/dev.tsv`` run in ``/work/repo`` -> ``data/dev.tsv``), else its own name; any
    other string (a relative path, ``builtin:pydoc``, a flag) unchanged."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    try:
        return Path(text).relative_to(Path.cwd()).as_posix() or "."
    except ValueError:
        return own_name(text)


def portable(value):
    """``value`` (a signature: dicts, lists, strings, paths) with every absolute path in it made portable
    (:func:`portable_path`), also inside a string such as a recorded command (``--data /home/me/dev.tsv``,
    ``--data=/home/me/dev.tsv``): a run's signature says what it read, not this machine's folders."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    if isinstance(value, Path):
        return portable_path(value)
    if isinstance(value, str) and os.sep in value:
        return " ".join(_portable_word(w) for w in value.split(" "))
    return value


def _portable_word(word: str) -> str:
    flag, eq, rest = word.partition("=")
    if eq and flag.startswith("-") and os.path.isabs(rest):
        return f"{flag}={portable_path(rest)}"
    return portable_path(word)
