"""The front door and the manual (issue 28): the README stays short and its links resolve, every manual page is
in the site's navigation, and the CLI reference generated at build time lists every command and flag the app
has (so a renamed flag changes the manual). `make docs-check` builds the whole site with --strict."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer.main

from headprune.cli import app

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import docs_hooks  # noqa: E402  (the mkdocs hook module at the repository root)


def test_the_readme_is_a_front_door_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert {"docs/families.md", "docs/cli.md", "docs/api.md", "REPRODUCTION.md"} <= set(links)
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert missing == []


def test_every_manual_page_is_in_the_navigation():
    nav = set(re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= nav and nav - pages == {"cli-reference.md", "reproduction.md"}  # the two the hook adds


def _commands(group, path=("headprune",)):
    for name, command in group.commands.items():
        if command.hidden:
            continue
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))


def test_the_cli_reference_lists_every_command_and_flag_of_the_app():
    page = docs_hooks.cli_reference()
    group = typer.main.get_command(app)
    seen = 0
    for path, command in _commands(group):
        section = page.split(f"`{' '.join(path)}`\n", 1)
        assert len(section) == 2, f"{' '.join(path)} missing from the CLI reference"
        body = section[1].split("\n#", 1)[0]
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                assert f"`{param.opts[0]}`" in body, (path, param.opts)
                seen += 1
            if param.hidden:
                assert f"`{param.opts[0]}`" not in body, (path, param.opts)  # old names stay out of the manual
    assert seen > 100 and "`--drop`" in page and "`--heads`" not in page.split("`headprune prune`", 1)[1][:3000]
