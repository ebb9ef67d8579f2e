"""The ``headprune`` command: a thin layer that parses, calls the library, and reports.

Every command turns a :class:`HeadpruneError` into one line on stderr and exit code 2; nothing is
written when the input is refused.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import typer

from . import __version__
from .errors import HeadpruneError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find, score and physically remove the attention heads a transformer does not need.")


def friendly(fn):
    """Library errors become a one-line message and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except HeadpruneError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        except (FileNotFoundError, NotADirectoryError, OSError) as e:
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


@app.command()
@friendly
def sites(
    model_dir: Path = typer.Argument(..., help="A Hugging Face model directory (or one written by headprune)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """List the attention sites of a model: name, kind, heads, kv heads, head_dim, parameters."""
    from .loading import load_model
    from .report_text import sites_table

    model = load_model(model_dir)
    rows = sites_table(model)
    if as_json:
        typer.echo(json.dumps({"model": str(model_dir), "class": type(model).__name__, "sites": rows}, indent=2))
        return
    header = f"{'site':<18} {'kind':<8} {'heads':>5} {'kv':>4} {'head_dim':>8} {'params':>10}"
    typer.echo(header)
    typer.echo("-" * len(header))
    for r in rows:
        typer.echo(f"{r['name']:<18} {r['kind']:<8} {r['heads']:>5} {r['kv_heads']:>4} {r['head_dim']:>8} "
                   f"{r['params']:>10,}")
    typer.echo(f"{len(rows)} sites, {sum(r['heads'] for r in rows)} heads "
               f"({type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters)")


@app.command()
@friendly
def prune(
    model_dir: Path = typer.Argument(..., help="Model directory to prune."),
    heads: str = typer.Option(..., "--heads", help='JSON {"site": [head indices to remove]} or a path to such a file.'),
    output: Path = typer.Option(..., "-o", "--output", help="Directory to write the pruned model to (must not exist)."),
):
    """Physically remove heads and save the smaller model (safetensors + plan in config.json)."""
    from .io import save_pruned
    from .loading import load_model, load_tokenizer
    from .surgery import prune_heads

    plan = _json_arg(heads, "--heads")
    if output.exists():
        raise HeadpruneError(f"--output {str(output)!r} already exists; choose a new directory")
    model = load_model(model_dir)
    before = sum(p.numel() for p in model.parameters())
    prune_heads(model, plan)
    after = sum(p.numel() for p in model.parameters())
    save_pruned(model, output, tokenizer=load_tokenizer(model_dir))
    typer.echo(f"pruned {model_dir} -> {output}: {before:,} -> {after:,} parameters ({after / before:.1%})")


@app.command()
@friendly
def demo(
    output: Path = typer.Option(Path("runs/demo"), "-o", "--output", help="Run directory."),
    quick: bool = typer.Option(False, "--quick", help="A tiny random model instead of the real one (seconds)."),
):
    """The built-in default: a real pretrained model scored, pruned and saved, with a report."""
    from .demo import run_demo

    path = run_demo(output, quick=quick)
    typer.echo(f"done: {path}")


def _json_arg(value: str, name: str) -> dict:
    text = Path(value).read_text() if Path(value).is_file() else value
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise HeadpruneError(f"{name}: not valid JSON ({e.msg} at char {e.pos}); expected e.g. "
                             '\'{"encoder.0.self": [0, 3]}\'') from None
    if not isinstance(data, dict):
        raise HeadpruneError(f"{name}: expected a JSON object mapping site -> head indices, got {type(data).__name__}")
    return data


def main() -> None:
    app(prog_name="headprune")


# Commands of other areas live in headprune/commands/<area>.py and register themselves on ``app``.
from .commands import register_all  # noqa: E402

register_all()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
