"""The typer app every command registers on, and the one error policy they share.

Every command turns a :class:`HeadpruneError` into one line on stderr and exit code 2; nothing is
written when the input is refused.
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path

import typer
from typer.core import TyperCommand, TyperGroup

from ..errors import HeadpruneError
from ..provenance import __version__


class _Switches:
    """Help that shows a plain switch (``--json``, ``--quiet``) as a switch: no ``<bool>`` after it, which read
    as if it took a value (``--json true`` is refused: a switch takes none)."""

    def get_params(self, ctx):
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""  # typer shows the metavar, when set, in place of the type
        return params


class Command(_Switches, TyperCommand):
    pass


class Group(_Switches, TyperGroup):
    pass


class App(typer.Typer):
    """``typer.Typer`` whose commands and groups show switches as switches (:class:`_Switches`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("cls", Group)
        super().__init__(*args, **kwargs)

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or Command, **kwargs)


app = App(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
          help="Find, score and physically remove the attention heads a transformer does not need.")


def friendly(fn):
    """Library errors become a one-line message and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (HeadpruneError, OSError) as e:  # OSError: FileNotFoundError, NotADirectoryError, ...
            from ..experiments.rundir import close_open_runs

            close_open_runs()  # a run refused midway: its lock goes, a directory it made without results too
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None

    return wrapper


def _version(value: bool):
    if value:
        typer.echo(f"headprune {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")):
    pass


def json_arg(value: str, name: str) -> dict:
    """A JSON object given inline or as a path to a file holding it (e.g. ``{"encoder.0.self": [0, 3]}``).

    A value that is not inline JSON (does not start with ``{`` or ``[``) is a path: a missing file is called
    that, not "not valid JSON". A key given twice is refused (JSON would silently keep the last)."""
    inline = value.lstrip().startswith(("{", "["))
    if not inline and not Path(value).is_file():
        raise HeadpruneError(f"{name} {value!r}: no such file; allowed: a JSON object inline (e.g. "
                             '\'{"encoder.0.self": [0, 3]}\') or the path of a file holding one')
    where = "" if inline else f" in file {value!r}"
    text = value if inline else Path(value).read_text()
    try:
        data = json.loads(text, object_pairs_hook=functools.partial(_unique_keys, name))
    except json.JSONDecodeError as e:
        raise HeadpruneError(f"{name}: not valid JSON{where} ({e.msg} at char {e.pos}); expected e.g. "
                             '\'{"encoder.0.self": [0, 3]}\'') from None
    if not isinstance(data, dict):
        raise HeadpruneError(f"{name}: expected a JSON object mapping site -> head indices, got {type(data).__name__}")
    return data


def no_repeated_heads(heads: dict, name: str) -> dict:
    """``heads`` ({site: [head indices]}) with no head listed twice for a site: a repeat is refused (the
    library would remove it once, silently, and the plan would not say what the user meant)."""
    for site, idx in heads.items():
        if isinstance(idx, list):
            repeated = next((h for i, h in enumerate(idx) if any(h == g and type(h) is type(g) for g in idx[:i])),
                            None)
            if repeated is not None:
                raise HeadpruneError(f"{name}[{site!r}]: head {repeated!r} given twice; allowed: each head once "
                                     f"(e.g. {{{json.dumps(site)}: {sorted(set(h for h in idx if isinstance(h, int)))}}})")
    return heads


def _unique_keys(name: str, pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise HeadpruneError(f"{name}: site {key!r} given twice; allowed: each site once, with all its heads "
                                 f"in one list (e.g. {{{json.dumps(key)}: [0, 3]}})")
        seen[key] = value
    return seen


def echo_headline(run_dir: Path, report: Path | None = None) -> None:
    """The headline rows of the run's results.json as an aligned two-column table, then the report's path."""
    path = Path(run_dir) / "results.json"
    from ..report.html import read_results

    rows = read_results(path).get("headline", []) if path.is_file() else []
    cells = [(str(label), f"{value:.4g}" if isinstance(value, float) else str(value)) for label, value in rows]
    width = max((len(label) for label, _ in cells), default=0)
    for label, value in cells:
        typer.echo(f"{label:<{width}}  {value}")
    if report is not None:
        typer.echo(f"report: {report}")


def escape_help(typer_app: typer.Typer) -> None:
    """Rich markup swallows ``[...]`` in help texts (``{"site": [heads]}`` would read ``{"site": }``):
    escape every command's, argument's, option's and group's help once, after all commands are registered,
    so help texts are written as they should read."""
    from rich.markup import escape

    def once(obj, attr: str = "help") -> None:
        if getattr(obj, attr, None) and not getattr(obj, "_headprune_escaped", False):
            setattr(obj, attr, escape(getattr(obj, attr)))
            obj._headprune_escaped = True

    once(typer_app.info)
    for command in typer_app.registered_commands:
        if command.help is None and command.callback is not None:
            command.help = inspect.getdoc(command.callback)
        once(command)
        for param in inspect.signature(command.callback).parameters.values():
            if isinstance(param.default, (typer.models.OptionInfo, typer.models.ArgumentInfo)):
                once(param.default)
    for group in typer_app.registered_groups:
        once(group)
        escape_help(group.typer_instance)
