"""Every command's --help reads right: nothing swallowed by rich markup, every option's default stated."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from headprune.cli import app

WIDTH = 100
BOX = re.compile(r"[│╭╮╰╯─┃━┏┓┗┛]")


def _group(command) -> bool:
    return hasattr(command, "commands")  # typer's click (it may ship its own) command group


def _commands(group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    out = []
    for name, command in sorted(group.commands.items()):
        out.append(((*path, name), command))
        if _group(command):
            out += _commands(command, (*path, name))
    return out


COMMANDS = _commands(typer.main.get_command(app))


def _flat(text: str) -> str:
    """Rendered help as one line: box drawing removed, runs of whitespace (line wraps) made one space."""
    return " ".join(BOX.sub(" ", text).split())


def _source(help_text: str) -> str:
    """The help text as written (a rich escape ``\\[`` is how a literal ``[`` is written)."""
    return " ".join(help_text.replace("\\[", "[").split())


@pytest.fixture(scope="module")
def rendered(monkeypatch_module) -> dict[tuple[str, ...], str]:
    runner = CliRunner()
    out = {}
    for path, _ in [((), None), *COMMANDS]:
        result = runner.invoke(app, [*path, "--help"], terminal_width=WIDTH)
        assert result.exit_code == 0, (path, result.output)
        out[path] = result.output
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:  # rich sizes its console from COLUMNS: a fixed width
        mp.setenv("COLUMNS", str(WIDTH))
        mp.setenv("TERMINAL_WIDTH", str(WIDTH))
        yield mp


def test_the_commands_are_all_there():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"sites", "prune", "demo", "evaluate", "ablate", "all-but-one", "cross-domain", "curve", "dynamics",
            "report", "compress", "bench", "train", "train classifier", "train translation", "importance"} <= names


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_texts_render_whole(rendered, path, command):
    """Every help text appears in full, brackets included: rich markup would turn
    '{"site": [heads]}' into '{"site": }' unless escaped."""
    flat = _flat(rendered[path])
    texts = [command.help or ""] + [p.help for p in command.params if getattr(p, "help", None) and not p.hidden]
    for text in texts:
        first = _source(text).split("\f")[0]
        if not first:
            continue
        assert first in flat, f"{' '.join(path)}: help text damaged in rendering:\n  {first}\nnot in\n  {flat}"
        for ch in "[{":
            assert first.count(ch) <= flat.count(ch)


@pytest.mark.parametrize("path, command", [(p, c) for p, c in COMMANDS if not _group(c)],
                         ids=[" ".join(p) for p, c in COMMANDS if not _group(c)])
def test_every_option_states_its_default_or_that_it_is_required(rendered, path, command):
    """typer's '[default: ...]' or '[required]' after the help counts, and so does the help itself naming
    its default (or requirement). Off-by-default switches (--json, --fresh, ...) state their default by being
    switches. Text that talks of 'the settings' default' names no value and does not count."""
    flat = _flat(rendered[path])
    missing = []
    for p in command.params:
        if p.param_type_name != "option" or p.hidden or p.name == "help":
            continue
        if p.is_flag and not p.secondary_opts and p.default is False:
            continue
        text = _source(p.help or "")
        assert "settings' default" not in text, f"{p.opts}: {text}"
        after = flat[flat.index(text) + len(text):].lstrip() if text and text in flat else ""
        stated = after.startswith(("[default:", "[required]")) or re.search(r"\bdefault\b|\brequired\b", text)
        if not stated:
            missing.append(f"{'/'.join(p.opts)}: {text!r}")
    assert not missing, f"{' '.join(path)}: options that state no default:\n" + "\n".join(missing)


def test_train_seed_and_max_length_say_what_they_do(rendered):
    classifier = _flat(rendered[("train", "classifier")])
    translation = _flat(rendered[("train", "translation")])
    for text in (classifier, translation):
        seed = text[text.index("--seed"):]
        assert "bootstrap" not in seed[:200]
    assert "longer pairs are skipped" in translation
    assert "Epochs (default 3)." in classifier and "Epochs (default 10)." in translation
    assert "(default 64; --preset iwslt: batches of up to 4096 tokens" in translation


def test_prune_and_evaluate_show_their_json_examples(rendered):
    assert '{"site": [head indices among the site\'s current heads]}' in _flat(rendered[("prune",)])
    assert '{"site": [heads]}' in _flat(rendered[("evaluate",)])


def test_brackets_in_any_help_text_survive_rich_markup():
    """The escaping is done once for the whole app, so a new help text with brackets needs no care."""
    from headprune.cli.app import escape_help

    demo = typer.Typer()

    @demo.command()
    def one(heads: str = typer.Option(None, "--heads", help='JSON {"site": [heads]}; [bold]not markup[/bold].'),
            other: int = typer.Option(1, "--other", help="[x] marks")):
        """Drop [heads] from a [site]."""

    @demo.command()
    def two(heads: str = typer.Option(None, "--heads", help="more [text]")):
        pass

    escape_help(demo)
    escape_help(demo)  # idempotent
    for name, texts in (("one", ['JSON {"site": [heads]}; [bold]not markup[/bold].', "[x] marks",
                                 "Drop [heads] from a [site]."]), ("two", ["more [text]"])):
        flat = _flat(CliRunner().invoke(demo, [name, "--help"], terminal_width=WIDTH).output)
        assert all(t in flat for t in texts), flat
