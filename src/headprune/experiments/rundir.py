"""Run directories: a signature, finished units appended as they complete, atomic result files.

A long sweep appends one JSON line per finished unit (a head, a step, an epoch) to ``units.jsonl``
and flushes it, so a killed run restarted with the same command skips what is done and ends with
the same results (a line cut short by a kill is dropped from the file and computed again, once).

Strict resume: a directory whose ``run.json`` holds another signature (any option, the data's or the
model's content hash, the code) is refused in one line naming the first difference; a non-empty
directory that is not a headprune run is refused (a user's files are never overwritten); ``run.lock``
(the writer's pid, created with ``O_EXCL``) keeps a second run out while one is writing, and a lock
left by a dead process is taken over with a warning. Nothing is written until the run produces its
first result, so a command refused on the way writes nothing. Files are opened without following
symbolic links (:mod:`headprune.safefiles`). The signature holds no absolute path of the machine
(:func:`headprune.provenance.portable`): a run directory can be shared as it is.

Under ``torchrun`` (:mod:`headprune.distributed`) only rank 0 writes the directory; the other ranks take
its verdict on the directory, read its finished units (to resume) and write their copies of tables and
figures to a scratch directory removed when the run is closed.

``HEADPRUNE_STOP_AFTER_UNITS=k`` makes a run exit with code 75 right after its k-th new unit is
written: a deterministic interruption, for resume tests.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

from ..core.store.checkpoint import check_writable
from ..distributed import gather, is_main
from ..errors import ConfigError
from ..provenance import portable
from ..safefiles import open_fd, read_bytes, write_atomic
from .signature import difference_message

IGNORED_IN_SIGNATURE = ("versions", "command")
PATH_SPELLINGS = {"model": "model_sha256", "data": "data_sha256", "split": "data_sha256",  # path key -> its hash
                  "choose_data": "data_sha256", "data_b": "data_sha256", "importance_data": "data_sha256",
                  "calib_data": "data_sha256", "oracle_from": "oracle_sha256", "teacher": "teacher_sha256"}
LOCK, META, UNITS = "run.lock", "run.json", "units.jsonl"
STOP_ENV = "HEADPRUNE_STOP_AFTER_UNITS"
STOPPED = 75  # exit code of a run stopped by STOP_ENV (EX_TEMPFAIL: rerun to go on)
_OPEN: weakref.WeakSet = weakref.WeakSet()  # runs of this process not yet closed


@dataclass(frozen=True)
class RunOutput:
    """Where an experiment writes its run directory and what a resume of it must match: what every
    ``run_*`` of :mod:`headprune.experiments` takes beside its model, data and settings."""

    path: str | Path  # the run directory (new, or this run's to resume)
    signature: dict | None = None  # the caller's part of run.json: model, data, split, n, command, ...
    fresh: bool = False  # start over in ``path``, dropping its finished units
    progress: bool = True  # progress bars on stderr

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, Path)) or not str(self.path):
            raise ConfigError(f"path={self.path!r}; allowed: a directory path (str or Path)")
        if self.signature is not None and not isinstance(self.signature, dict):
            raise ConfigError(f"signature={self.signature!r}; allowed: a dict or None")
        for name in ("fresh", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}; allowed: True or False")

    def open(self, signature: dict) -> RunDir:
        """The run directory at ``path`` under the full ``signature`` (the caller's and the method's)."""
        return RunDir(self.path, signature, fresh=self.fresh)


class RunDir:
    def __init__(self, path: str | Path, signature: dict, *, fresh: bool = False, made_here: bool = False):
        """``made_here``: the caller has just created ``path`` and written its first files (e.g. the pruned
        model of ``compress``): they are this run's, not a user's."""
        self.path = Path(path)
        self.signature = portable(signature)  # this machine's absolute paths: relative or by name (run.json travels)
        self._state = {"started": False, "created": not self.path.exists(), "lock": None}
        self._fresh, self._written, self._stop_after = fresh, 0, _stop_after()
        self.main = is_main()
        refused = None
        if self.main:
            try:
                self._open(made_here)
            except ConfigError as e:
                refused = str(e)
        refused = gather(refused)[0]  # under torchrun every rank takes rank 0's verdict (or errors with it)
        if refused is not None:
            raise ConfigError(refused)
        self.units = {} if fresh else self._read_units()
        if not self.main:  # its copies of tables and figures go to a scratch directory
            self.path = Path(tempfile.mkdtemp(prefix="headprune-rank-"))
            self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, True)
            _OPEN.add(self)

    def _open(self, made_here: bool) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"output {str(self.path)!r} exists and is not a directory")
        if not self._state["created"] and not made_here:
            self._check_existing(self._fresh)
        check_writable(self.path)  # a read-only or unwritable output is named now, not by a raw [Errno 30]
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        self._finalizer = weakref.finalize(self, _release, self.path, self._state)
        _OPEN.add(self)

    def _check_existing(self, fresh: bool) -> None:
        links = sorted(p.name for p in self.path.iterdir() if p.is_symlink())
        if links:
            raise ConfigError(f"output {str(self.path)!r} holds symbolic links ({', '.join(links)}); headprune does "
                              "not follow links in a run directory (allowed: regular files; remove them)")
        meta = self.path / META
        if meta.exists():
            old = _load_signature(meta)
            if not fresh:
                new = json.loads(json.dumps(_comparable(self.signature), default=_plain))  # as run.json holds it
                message = difference_message(_comparable(old), new)
                if message:
                    raise ConfigError(f"output {str(self.path)!r} holds another run: {message}; pass --fresh to "
                                      "start over, or choose another -o directory")
            return
        foreign = sorted(p.name for p in self.path.iterdir() if not _own(p.name))
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise ConfigError(f"output {str(self.path)!r} is not empty ({shown}) and holds no headprune run "
                              "(no run.json); allowed: a new or empty directory, or a run directory of this "
                              "command (to resume)")

    def _lock(self) -> None:
        lock = self.path / LOCK
        for _ in range(3):
            try:
                fd = open_fd(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                pid = _lock_pid(lock)
                if pid is not None and pid != os.getpid() and _alive(pid):
                    raise ConfigError(f"output {str(self.path)!r} is in use by another headprune run (pid {pid}, "
                                      f"{LOCK}); allowed: one run per directory at a time (wait for it to end, or "
                                      "choose another -o directory; if no such run is going on, delete "
                                      f"{LOCK})") from None
                if pid != os.getpid():
                    print(f"warning: {str(lock)!r} was left by pid {pid}, which is no longer running; taking it "
                          "over", file=sys.stderr)
                try:
                    os.unlink(lock)
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()}\n")
            self._state["lock"] = lock
            return
        raise ConfigError(f"output {str(self.path)!r}: could not take {LOCK}; another run keeps taking it")

    def _start(self) -> None:
        """The first write of this run: only now does the directory get its run.json (and, --fresh, loses
        its old units)."""
        if self._state["started"]:
            return
        if self._fresh:
            (self.path / UNITS).unlink(missing_ok=True)
        write_atomic(self.path / META, json.dumps({"signature": self.signature}, indent=2, default=_plain))
        self._state["started"] = True

    def _read_units(self) -> dict[str, dict]:
        units: dict[str, dict] = {}
        path = self.path / UNITS
        if not os.path.lexists(path):
            return units
        data = read_bytes(path)
        complete, newline, partial = data.rpartition(b"\n")
        if partial:  # a line cut short by a kill: drop it from the file, so the unit is written again whole
            fd = open_fd(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, len(complete) + len(newline))
            finally:
                os.close(fd)
        for line in complete.split(b"\n") if newline else []:
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(record, dict) and "unit" in record:
                units[record["unit"]] = record
        return units

    def done(self, unit: str) -> bool:
        return unit in self.units

    def get(self, unit: str) -> dict:
        return self.units[unit]

    def add(self, unit: str, record: dict) -> dict:
        if not self.main:  # rank 0 appends every rank's units as they are gathered
            self.units[unit] = {"unit": unit, **record}
            return self.units[unit]
        self._start()
        record = {"unit": unit, **record}
        line = (json.dumps(record, default=_plain) + "\n").encode()
        fd = open_fd(self.path / UNITS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.units[unit] = record
        self._written += 1
        _maybe_stop(self)
        return record

    def write_json(self, name: str, data) -> Path:
        return self.write_text(name, json.dumps(_finite(data), indent=2, default=_plain))

    def write_csv(self, name: str, rows: list[dict]) -> Path:
        buf = io.StringIO()
        if rows:
            writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return self.write_text(name, buf.getvalue())

    def write_text(self, name: str, text: str) -> Path:
        self._start()
        return write_atomic(self.path / name, text)

    def close(self) -> None:
        """Release the lock (and, when the run wrote nothing into a directory it created, remove it)."""
        self._finalizer()
        _OPEN.discard(self)


def close_open_runs() -> None:
    """Close every run of this process still open (a command refused midway: its lock goes, and a directory
    it created without writing a result is removed)."""
    for run in list(_OPEN):
        run.close()


def _release(path: Path, state: dict) -> None:
    lock = state.get("lock")
    if lock is not None and _lock_pid(lock) == os.getpid():
        Path(lock).unlink(missing_ok=True)
    state["lock"] = None
    if state["created"] and not state["started"]:
        try:
            path.rmdir()  # only if empty: nothing of a result was written
        except OSError:
            pass


def _stop_after() -> int | None:
    value = os.environ.get(STOP_ENV)
    if not value:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ConfigError(f"{STOP_ENV}={value!r}; allowed: an integer >= 1 (units to write before stopping)")
    return int(value)


def _maybe_stop(run: RunDir) -> None:
    if run._stop_after is not None and run._written >= run._stop_after:
        run.close()
        print(f"stopped after {run._written} units ({STOP_ENV}={run._stop_after}); rerun the same command to "
              "resume", file=sys.stderr)
        raise SystemExit(STOPPED)


def _own(name: str) -> bool:
    return name in (LOCK, UNITS) or name.endswith(".tmp")


def _load_signature(meta: Path) -> dict:
    """The signature of a run directory's run.json; any other run.json (malformed, or another tool's, e.g. a
    training run's) is refused even with --fresh: that folder is not this kind of run, and is left alone."""
    try:
        data = json.loads(read_bytes(meta))
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    signature = data.get("signature") if isinstance(data, dict) else None
    if not isinstance(signature, dict):
        raise ConfigError(f"{str(meta.parent)!r} holds a run.json that is not a headprune study run's (no "
                          "signature; e.g. a training run); allowed: a new or empty directory, or a run directory "
                          "of this command; choose another -o directory")
    return signature


def _lock_pid(lock: Path) -> int | None:
    try:
        text = read_bytes(lock).decode(errors="replace").strip()
    except (OSError, ConfigError):
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _comparable(signature: dict) -> dict:
    """What must match to resume. Files are compared by content (their sha256 in the signature), not by how
    their paths were spelled: ``dev.tsv`` and ``/home/me/dev.tsv`` with the same bytes are the same data."""
    out = {k: v for k, v in signature.items() if k not in IGNORED_IN_SIGNATURE}
    for key, by_content in PATH_SPELLINGS.items():
        if out.get(by_content):
            out.pop(key, None)
    if out.get("data_sha256") and isinstance(out.get("evaluation"), list):
        out["evaluation"] = [{k: v for k, v in e.items() if k != "data"} if isinstance(e, dict) else e
                             for e in out["evaluation"]]
    return out


def _finite(value):
    """Strict JSON: NaN and infinities become null."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _plain(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
