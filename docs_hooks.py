"""MkDocs hooks (mkdocs.yml ``hooks:``): pages made at build time, never committed as copies.

- ``cli-reference.md``: every command and flag, read from headprune's typer app itself, so a renamed or
  removed flag changes the manual the next time it is built.
- ``reproduction.md``: REPRODUCTION.md from the repository root (its quoted numbers are checked there),
  with the figures it shows. Pages link to it as ``../REPRODUCTION.md`` (which works on GitHub too);
  the build points those links at the page.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def _type_name(param) -> str:
    """int, float, text, path, ... (click's type name, or the annotation typer keeps)."""
    if getattr(param, "type", None) is not None:
        return param.type.name.lower()
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    name = getattr(annotation, "__name__", "") if annotation is not None else ""
    return {"str": "text", "Path": "path"}.get(name, name.lower())


def _option_row(param) -> str:
    """One table row of an option (typer's parameters read like click's: opts, type, default, help)."""
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    kind = "flag" if getattr(param, "is_flag", False) else _type_name(param)
    default = param.default
    shown = "" if default is None or callable(default) or param.required else f"`{default}`"
    text = (getattr(param, "help", None) or "").replace("\\[", "[").replace("|", "\\|").replace("\n", " ")
    required = " **required**" if param.required else ""
    return f"| {names} | {kind}{required} | {shown} | {text} |"


def _command(path: str, command, depth: int) -> list[str]:
    """A command's section: help, usage and options; a group's subcommands follow it."""
    lines = [f"{'#' * depth} `{path}`", ""]
    if command.help:
        lines += [command.help.replace("\b\n", "").strip(), ""]
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    names = [(a.metavar or a.name.upper()) + ("..." if a.nargs == -1 else "") for a in arguments]
    usage = " ".join([path, *names, "[OPTIONS]", *(["COMMAND"] if hasattr(command, "commands") else [])])
    lines += ["```", usage, "```", ""]
    options = [p for p in command.params if p.param_type_name == "option" and not p.hidden]
    if options:
        lines += ["| option | type | default | help |", "|---|---|---|---|", *map(_option_row, options), ""]
    if hasattr(command, "commands"):
        for name in sorted(command.commands):
            sub = command.commands[name]
            if not sub.hidden:
                lines += _command(f"{path} {name}", sub, min(depth + 1, 4))
    return lines


def cli_reference() -> str:
    """The CLI reference page, from the typer app as it is now."""
    import typer.main

    from headprune.cli import app

    group = typer.main.get_command(app)
    lines = ["# CLI reference", "",
             "Generated from the `headprune` app when this manual is built (`docs_hooks.py`), so it lists the "
             "commands and flags of the code it was built from. `headprune COMMAND --help` prints the same. "
             "How the commands fit together: [CLI guide](cli.md).", ""]
    lines += _command("headprune", group, 2)
    return "\n".join(lines) + "\n"


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, "cli-reference.md", content=cli_reference()))
    reproduction = (ROOT / "REPRODUCTION.md").read_text()
    files.append(File.generated(config, "reproduction.md", content=reproduction))
    for image in sorted(set(IMAGE.findall(reproduction))):
        if not image.startswith(("http://", "https://")) and files.get_file_from_path(image) is None:
            files.append(File.generated(config, image, abs_src_path=str(ROOT / image)))
    return files


def on_page_markdown(markdown, page, config, files):
    return markdown.replace("](../REPRODUCTION.md", "](reproduction.md")
