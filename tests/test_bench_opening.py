"""The benchmarks share one opening and one table writer (issue #48 item 6): a results file's name, command, machine
and versions come from ``benchmarks/recorded.py``'s ``opening``, a docs table's lines from
``benchmarks/doc_tables.py``'s ``markdown_table``. A script that still records the machine or the versions by
itself, or writes a table rule by hand, is one of the exceptions named here with the reason."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
from doc_tables import markdown_table  # noqa: E402
from recorded import opening  # noqa: E402

HOME = {"recorded.py", "doc_tables.py"}
BEING_REWORKED = "being reworked (recovery curve, plan replay, compress memory); onto the shared opening after that"
OWN_HEADER = {  # the results file's keys stay what they were: none is {name, command, machine, versions}
    "recovery.py": BEING_REWORKED, "recovery_swaps.py": BEING_REWORKED, "apply_replay.py": BEING_REWORKED,
    "compress_memory.py": BEING_REWORKED,
    "distill_selection.py": "records command and versions, no machine",
    "fit_size.py": "records command and versions, no machine",
    "reconstruct_speed.py": "records command and versions, no machine",
    "selection_speed.py": "records versions and a fixed command, no machine",
    "significance_level.py": "records the code's identity and versions, no command or machine",
    "heads_and_neurons.py": "versions inside each task's signature, the machine of its timing run",
    "method_comparison.py": "command and versions inside its signature, no machine",
    "tuning_diagnosis.py": "versions inside its signature, no command or machine",
    "import_cost.py": "a machine of its own fields (processor, cpus), not machine_info",
    "quantized_pruned.py": "a machine of its own fields (processor, cpus), not machine_info",
    "own_loss_tolerance.py": "the machine as one line of text",
    "llamacpp_budgets.py": "a machine per speed group (with its load) besides the opening's",
}
OWN_RULES = {"recovery.py": BEING_REWORKED, "recovery_swaps.py": BEING_REWORKED}
RECORDS = re.compile(r"\bmachine_info\b|\bversions\(\)")
RULE = re.compile(r"---:?\|")


def _scripts() -> dict[str, str]:
    paths = [*BENCH.glob("*.py"), *(BENCH / "peers").glob("*.py")]
    return {p.relative_to(BENCH).as_posix(): p.read_text(encoding="utf-8") for p in paths if p.name not in HOME}


def test_results_headers_come_from_the_opening_outside_the_named_exceptions():
    own = {name for name, text in _scripts().items() if RECORDS.search(text)}
    assert own <= set(OWN_HEADER), f"record the machine and versions through recorded.opening: {sorted(own - set(OWN_HEADER))}"


def test_markdown_tables_come_from_the_table_writer_outside_the_named_exceptions():
    own = {name for name, text in _scripts().items() if RULE.search(text)}
    assert own <= set(OWN_RULES), f"write tables through doc_tables.markdown_table: {sorted(own - set(OWN_RULES))}"


@pytest.mark.parametrize("names", [OWN_HEADER, OWN_RULES])
def test_the_named_exceptions_are_still_exceptions(names):
    scripts = _scripts()
    pattern = RECORDS if names is OWN_HEADER else RULE
    assert all(name in scripts and pattern.search(scripts[name]) for name in names)


def test_opening_and_table_writer():
    head = opening("x", BENCH / "x.py", ["--quick", str(ROOT / "runs" / "m")], load=False, label="benchmark")
    assert list(head) == ["benchmark", "command", "machine", "versions"]
    assert head["command"] == "python benchmarks/x.py --quick runs/m" and "loadavg_at_start" not in head["machine"]
    assert markdown_table(["a", "b"], [[1, ""]], align="lr") == ["| a | b |", "|---|---:|", "| 1 | |"]
