"""The results file of a peer benchmark: resumed per method configuration, written atomically, and the
generated block of a docs page replaced between its markers (shared by ``llm_peers.py`` and ``encoder_peers.py``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def resume(output: Path, settings: dict, config_of: Callable[[str], dict]) -> dict:
    """The rows of an earlier run with the same shared settings whose method configuration is unchanged
    (:func:`declared` of the row's config equal to ``config_of(method)``); ``{"rows": []}`` otherwise."""
    if output.is_file():
        old = json.loads(output.read_text())
        if old.get("settings") == json.loads(json.dumps(settings)):
            old["rows"] = [r for r in old["rows"]
                           if declared(r.get("config")) == json.loads(json.dumps(config_of(r["method"])))]
            return old
    return {"rows": []}


def declared(config: dict | None) -> dict | None:
    """A row's config without ``chosen``: the settings a row chose from its declared grid on held-out blocks are
    its outcome (the grid, in the config, is what it depends on), so a finished row is kept whatever it chose."""
    return None if config is None else {k: v for k, v in config.items() if k != "chosen"}


def save(output: Path, out: dict) -> None:
    """Write ``out`` to ``output`` through a temporary sibling (never half-written)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1, default=float) + "\n")
    os.replace(tmp, output)


def replace_block(page: str | Path, marks: tuple[str, str], block: str | None, results: str, command: str) -> None:
    """Put ``block`` (or, when None, a note that ``results`` is not committed yet and how to make it) between
    ``marks`` in ``page``; the rest of the page is kept."""
    page = Path(page)
    text = page.read_text()
    if marks[0] not in text or marks[1] not in text:
        raise SystemExit(f"{page}: no {marks[0]} ... {marks[1]} block to fill")
    if block is None:
        block = "\n".join([marks[0], "", "!!! note \"No committed run yet\"",
                           f"    `{results}` does not exist yet: run `{command}`, commit the JSON, then "
                           f"`{command.split(' --')[0]} --write-docs {page.parent.name}/{page.name}`.", "", marks[1]])
    head, rest = text.split(marks[0], 1)
    page.write_text(head + block + rest.split(marks[1], 1)[1])


def write_section(page: str | Path, begin: str, end: str, body: str) -> None:
    """Put ``body`` between the lines ``begin`` and ``end`` of ``page`` (a generated section of the docs), the rest
    of the page kept; a one-line exit when the page lacks either marker."""
    page = Path(page)
    text = page.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise SystemExit(f"--write-docs {page}: no {begin} ... {end} markers; allowed: a page with both")
    head, rest = text.split(begin, 1)
    page.write_text(f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}", encoding="utf-8")
