"""The typer app every command registers on, and the one error policy they share.

Every command turns a :class:`HeadpruneError` into one line on stderr and exit code 2; nothing is
written when the input is refused.
"""

from __future__ import annotations

import functools
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
