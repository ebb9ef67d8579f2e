"""The one markdown table writer of the benchmarks' generated docs blocks (README, docs/*.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """The lines of a markdown table: ``| a | b |``, the rule (``---`` per column, ``---:`` where ``align`` has
    ``r`` at that column's place; ``align`` shorter than the header leaves the rest ``---``), then one line per
    row, each cell as ``str`` gives it (an empty cell as ``| |``)."""
    if any(a not in "lr" for a in align) or len(align) > len(header):
        raise ValueError(f"align={align!r}: one of 'l' / 'r' per column at most, {len(header)} columns")
    rule = "|" + "".join("---:|" if i < len(align) and align[i] == "r" else "---|" for i in range(len(header)))
    return [_line(header), rule, *(_line(row) for row in rows)]


def _line(cells: Sequence[object]) -> str:
    return "|" + "".join(f" {c} |" if str(c) else " |" for c in cells)
