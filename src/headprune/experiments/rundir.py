"""Run directories: a signature, finished units appended as they complete, atomic result files.

A long sweep appends one JSON line per finished unit (a head, a step, an epoch) to ``units.jsonl``
and flushes it, so a killed run restarted with the same command skips what is done and ends with
the same results. A directory that holds a run with another signature is refused, never mixed.

Under ``torchrun`` only rank 0 writes the directory; the other ranks read its finished units (to resume)
and write their copies of tables and figures to a scratch directory removed when the process ends.
"""

from __future__ import annotations

import atexit
import csv
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..distributed import barrier, is_main
from ..errors import ConfigError

IGNORED_IN_SIGNATURE = ("versions", "command")


class RunDir:
    def __init__(self, path: str | Path, signature: dict, *, fresh: bool = False):
        self.path = Path(path)
        self.signature = signature
        meta = self.path / "run.json"
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"output {str(self.path)!r} exists and is not a directory")
        if meta.is_file() and not fresh:
            old = json.loads(meta.read_text())["signature"]
            if _comparable(old) != _comparable(signature):
                diff = sorted(k for k in set(old) | set(signature)
                              if k not in IGNORED_IN_SIGNATURE and old.get(k) != signature.get(k))
                raise ConfigError(f"output {str(self.path)!r} holds a different run (differs in {diff}); "
                                  "choose another -o directory or pass --fresh to start over")
        main = is_main()
        if main:
            self.path.mkdir(parents=True, exist_ok=True)
            if fresh and (self.path / "units.jsonl").exists():
                (self.path / "units.jsonl").unlink()
            self.write_json("run.json", {"signature": signature})
        barrier()  # the other ranks read the units once rank 0 has set the directory up
        self.units = self._read_units()
        self.main = main
        if not main:
            self.path = Path(tempfile.mkdtemp(prefix="headprune-rank-"))
            atexit.register(shutil.rmtree, self.path, ignore_errors=True)

    def _read_units(self) -> dict[str, dict]:
        units: dict[str, dict] = {}
        path = self.path / "units.jsonl"
        if not path.is_file():
            return units
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill: that unit is simply redone
            units[record["unit"]] = record
        return units

    def done(self, unit: str) -> bool:
        return unit in self.units

    def get(self, unit: str) -> dict:
        return self.units[unit]

    def add(self, unit: str, record: dict) -> dict:
        record = {"unit": unit, **record}
        if self.main:
            with open(self.path / "units.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
        self.units[unit] = record
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
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(target)
        return target


def _comparable(signature: dict) -> dict:
    return {k: v for k, v in signature.items() if k not in IGNORED_IN_SIGNATURE}


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
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
