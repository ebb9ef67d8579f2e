"""One self-contained ``report.html`` per run directory: images embedded, opens offline.

Reads ``results.json``: ``title``, ``signature``, ``headline`` ([label, value] pairs), ``figures``
([{file, caption}]), ``tables`` ([{title, file (CSV), columns?, max_rows?}]), ``notes`` (strings).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path

from ..errors import ConfigError
from ..safefiles import check_not_link, inside, read_bytes, read_text, write_atomic

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
.headline{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{background:#f5f7fa;border:1px solid #dde3ea;border-radius:6px;padding:.6em .9em;min-width:10em}
.card .v{font-size:1.35em;font-weight:600} .card .l{font-size:.8em;color:#555}
figure{margin:1.2em 0} figure img{max-width:100%;border:1px solid #eee} figcaption{font-size:.9em;color:#444}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0} td,th{border:1px solid #ddd;padding:.25em .5em;text-align:right}
th{background:#f0f0f0} td:first-child,th:first-child{text-align:left}
details{margin:.5em 0} .sig td{text-align:left} .note{color:#444;font-size:.92em}
"""


def build_report(run_dir: str | Path) -> Path:
    """Write ``run_dir/report.html`` from its results.json; a folder that is not a headprune run (no run.json) is
    refused before anything is written."""
    run_dir = Path(run_dir)
    results_path = run_dir / "results.json"
    if not results_path.is_file():
        raise ConfigError(f"run directory {str(run_dir)!r} has no results.json; expected a headprune run directory")
    if not (run_dir / "run.json").is_file() or (run_dir / "run.json").is_symlink():  # report.html may be the user's own
        raise ConfigError(f"run directory {str(run_dir)!r} has a results.json but no run.json: it is not a headprune run "
                          "directory, and its report.html is left as it is; allowed: a directory a headprune command "
                          "wrote (it holds run.json beside results.json)")
    results = read_results(results_path)
    _check_inside(run_dir, results)
    try:
        text = _render(run_dir, results)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise ConfigError(f"{str(results_path)!r} does not have the layout a headprune command writes ({e!r:.80}); "
                          "allowed: title, headline [[label, value], ...], notes, figures, tables, signature") from None
    return write_atomic(run_dir / "report.html", text)


def _render(run_dir: Path, results: dict) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(results.get('title', 'headprune'))}</title>",
             f"<style>{CSS}</style></head><body>",
             f"<h1>{_e(results.get('title', 'headprune run'))}</h1>"]
    if results.get("subtitle"):
        parts.append(f"<p class='note'>{_e(results['subtitle'])}</p>")
    if results.get("headline"):
        parts.append("<div class='headline'>")
        for label, value in results["headline"]:
            parts.append(f"<div class='card'><div class='v'>{_e(value)}</div><div class='l'>{_e(label)}</div></div>")
        parts.append("</div>")
    for note in results.get("notes", []):
        parts.append(f"<p class='note'>{_e(note)}</p>")
    for fig in results.get("figures", []):
        png = run_dir / fig["file"]
        if png.is_file():
            data = base64.b64encode(read_bytes(png)).decode()
            caption = fig.get("caption", "") + _drawn_from(png)
            parts.append(f"<figure><img alt='{_e(fig.get('caption', ''))}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{_e(caption)}</figcaption></figure>")
    for table in results.get("tables", []):
        parts.append(_table(run_dir, table))
    parts.append("<h2>Signature (to reproduce this run)</h2><table class='sig'>")
    for key, value in results.get("signature", {}).items():
        shown = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        parts.append(f"<tr><th>{_e(key)}</th><td>{_e(shown)}</td></tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _drawn_from(png: Path) -> str:
    """' (drawn from TABLE, sha256 abc...)' when the figure's directory records its source (figures.json)."""
    index = png.parent / "figures.json"
    if not index.is_file():
        return ""
    entry = json.loads(read_bytes(index)).get(png.name)
    return f" (drawn from {entry['source']}, sha256 {entry['sha256'][:12]})" if entry else ""


def _check_inside(run_dir: Path, results: dict) -> None:
    """Every file results.json names (figures, tables) lies inside the run directory and is no link: a report
    never embeds what lies elsewhere (``/etc/passwd``, ``../secret.csv``)."""
    for key in ("figures", "tables"):
        specs = results.get(key, [])
        if not isinstance(specs, list) or not all(isinstance(s, dict) and isinstance(s.get("file"), str)
                                                  for s in specs):
            raise ConfigError(f"{str(run_dir / 'results.json')!r}: {key!r} = {specs!r:.60}; allowed: a list of "
                              "objects, each with the 'file' name of a file inside the run directory")
        for spec in specs:
            inside(run_dir, spec["file"], what=f"results.json {key[:-1]}")
            check_not_link(run_dir / spec["file"])


def read_results(path: Path) -> dict:
    """A run's ``results.json`` as a dict; a malformed one is refused in one line (no traceback)."""
    try:
        results = json.loads(read_text(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{str(path)!r} is not valid JSON ({getattr(e, 'msg', e)}); allowed: the results.json a "
                          "headprune command writes (rerun the command to rewrite it)") from None
    if not isinstance(results, dict):
        raise ConfigError(f"{str(path)!r} holds a JSON {type(results).__name__}; allowed: the JSON object a "
                          "headprune command writes")
    return results


def _table(run_dir: Path, spec: dict) -> str:
    path = run_dir / spec["file"]
    if not path.is_file():
        return ""
    rows = list(csv.DictReader(io.StringIO(read_text(path), newline="")))
    columns = spec.get("columns") or (list(rows[0]) if rows else [])
    limit = spec.get("max_rows", 40)
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_e(_cell_text(r.get(c, '')))}</td>" for c in columns) + "</tr>"
                   for r in rows[:limit])
    more = f"<p class='note'>{len(rows) - limit} more rows in {_e(spec['file'])}</p>" if len(rows) > limit else ""
    title = _e(spec.get("title", spec["file"]))
    return f"<h2>{title}</h2><table><tr>{head}</tr>{body}</table>{more}"


def _cell_text(value: str) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    if number.is_integer() and "." not in value and "e" not in value.lower():
        return value
    return f"{number:.4g}"


def _e(value) -> str:
    return html.escape(str(value))
