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

from ..errors import HeadpruneError
from ..provenance import __version__

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find, score and physically remove the attention heads a transformer does not need.")


def friendly(fn):
    """Library errors become a one-line message and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (HeadpruneError, OSError) as e:  # OSError: FileNotFoundError, NotADirectoryError, ...
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
    """A JSON object given inline or as a path to a file holding it (e.g. ``{"encoder.0.self": [0, 3]}``)."""
    text = Path(value).read_text() if Path(value).is_file() else value
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise HeadpruneError(f"{name}: not valid JSON ({e.msg} at char {e.pos}); expected e.g. "
                             '\'{"encoder.0.self": [0, 3]}\'') from None
    if not isinstance(data, dict):
        raise HeadpruneError(f"{name}: expected a JSON object mapping site -> head indices, got {type(data).__name__}")
    return data


def echo_headline(run_dir: Path, report: Path | None = None) -> None:
    """The headline rows of the run's results.json as an aligned two-column table, then the report's path."""
    path = Path(run_dir) / "results.json"
    rows = json.loads(path.read_text()).get("headline", []) if path.is_file() else []
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
