"""What a new user meets running the README's commands as written: the README's code blocks run exactly as
they stand (the Python example, then the CLI example on a tiny model in a folder named MODEL_DIR), and the
headline a command prints names what it claims to (found by running each README command on the study models)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from tiny import build, word_tokenizer

runner = CliRunner()
WORDS = "good bad film plot dull fun long short great awful".split()
ROOT = Path(__file__).resolve().parents[1]


def readme_blocks(language: str) -> list[str]:
    """The README's fenced code blocks in ``language``, as written."""
    return re.findall(rf"^```{language}\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory) -> dict:
    """The README's Python block, then its CLI block, run as written in one fresh folder. The CLI block's
    MODEL_DIR, train.tsv and dev.tsv are made there (a tiny BERT classifier, 3 labels, and its data)."""
    import os

    where = tmp_path_factory.mktemp("readme")
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(4 + i % 3)) for i in range(24)]
    for name, rows in (("train.tsv", texts[:12]), ("dev.tsv", texts[12:])):
        (where / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 3}\n" for i, t in enumerate(rows)))
    hp.save_pruned(build("bert"), where / "MODEL_DIR", tokenizer=word_tokenizer(texts))
    python, = readme_blocks("python")
    bash = readme_blocks("bash")
    before = Path.cwd()
    os.chdir(where)
    try:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(python, "README.md", "exec"), {"__name__": "__readme__"})
        commands = {}
        for line in bash[1].splitlines():
            args = shlex.split(line, comments=True)
            if args:
                assert args[0] == "headprune", line
                commands[args[1]] = runner.invoke(app, args[1:])
    finally:
        os.chdir(before)
    return {"where": where, "printed": printed.getvalue(), "commands": commands, "setup": bash[0]}


def test_readme_python_block_runs_and_prunes_what_it_masked(readme_run):
    """The old snippet held `torch.tensor([1., 0., 1., 1., ...])` and a model path that did not exist: pasted,
    it failed. The new one runs; its printed difference is the pruned model's logits against the masked ones."""
    lines = readme_run["printed"].strip().splitlines()
    assert lines[0].startswith("[Site(name='encoder.0.self'") and float(lines[-1]) <= 1e-5
    reloaded = hp.load_pruned(readme_run["where"] / "pruned")
    kept = hp.kept_heads(reloaded)
    assert sum(len(h) for h in kept.values()) == 4  # the lowest half of 2 x 4 heads removed, as printed


def test_readme_shell_blocks_run_as_written(readme_run):
    """The set-up block names the two targets CI runs; every CLI line exits 0 and writes what it says."""
    assert readme_run["setup"].split("\n")[0].startswith("make demo") and "make test" in readme_run["setup"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    ci = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in ci  # CI runs the README's command (then the oldest transformers: make test-oldest)
    # ... and the README's first command's path on the real model: `make demo-check` shares `make demo`'s install
    # and runs every step (issue 38: the demo broke while the tests stayed green)
    assert "make demo-check" in ci and re.search(r"^demo-check: install-demo$", makefile, re.M)
    assert re.search(r"^demo: install-demo$", makefile, re.M)
    commands = readme_run["commands"]
    assert list(commands) == ["sites", "demo", "importance", "prune", "compress"]
    for name, result in commands.items():
        assert result.exit_code == 0, (name, result.output)
    assert "encoder.0.self" in commands["sites"].stdout  # `sites pruned/`: the Python block's saved model
    where = readme_run["where"]
    assert hp.kept_heads(hp.load_pruned(where / "runs" / "pruned"))["encoder.0.self"] == [1, 2]
    assert (where / "runs" / "imp" / "results.json").is_file() and (where / "runs" / "c" / "config.json").is_file()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny BERT classifier (3 labels) with a word tokenizer, and a 12-sentence TSV it can read."""
    root = tmp_path_factory.mktemp("walkthrough")
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(4 + i % 3)) for i in range(12)]
    data = root / "dev.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 3}\n" for i, t in enumerate(texts)))
    hp.save_pruned(build("bert"), root / "bert", tokenizer=word_tokenizer(texts))
    return root / "bert", data


def test_all_but_one_headline_names_the_worst_site_and_its_score(tiny, tmp_path):
    """The headline's last row was 'largest drop  -17.94' (a negative drop, no site); it names the site whose
    one kept head loses the most and prints that site's score, as all-but-one.csv has it."""
    model, data = tiny
    out = tmp_path / "abo"
    result = runner.invoke(app, ["all-but-one", str(model), "--task", "classification", "--data", str(data),
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    with open(out / "all_but_one.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    base = json.loads((out / "results.json").read_text())["base"]
    worst = min(rows, key=lambda r: float(r["score"]))  # accuracy: the lowest score is the largest loss
    label, value = json.loads((out / "results.json").read_text())["headline"][-1]
    assert label == f"worst: {worst['site']} keeping head {worst['kept_head']}"
    assert float(value) == pytest.approx(100 * float(worst["score"]), abs=0.006)
    assert float(worst["score"]) <= base
    assert "largest drop" not in result.stdout and label in result.stdout


def test_dynamics_headline_at_any_step(tiny, tmp_path):
    """The headline read 'relative score at 40% pruned  nan%' whenever --step did not land on 0.4 (0.25 here);
    it reports the point closest to 40% (here 50%; ties: the smaller), with the share it is at, as dynamics.csv has it."""
    model, data = tiny
    from transformers import AutoTokenizer

    epochs, tokenizer = tmp_path / "model", AutoTokenizer.from_pretrained(model)
    for e in (1, 2):
        hp.save_pruned(build("bert", seed=e), epochs / f"epoch-{e}", tokenizer=tokenizer)
    out = tmp_path / "dyn"
    result = runner.invoke(app, ["dynamics", str(epochs / "epoch-1"), str(epochs / "epoch-2"), "--task",
                                 "classification", "--data", str(data), "--step", "0.25", "-o", str(out)])
    assert result.exit_code == 0, result.output
    with open(out / "dynamics.csv", newline="") as f:
        at = {(int(r["epoch"]), float(r["fraction"])): float(r["relative"]) for r in csv.DictReader(f)}
    headline = json.loads((out / "results.json").read_text())["headline"]
    assert headline[1:] == [[f"epoch {e}: relative score at 50% pruned", f"{at[e, 0.5]:.1%}"] for e in (1, 2)]
    assert "nan" not in result.stdout


def test_bench_dtype_help_is_its_own():
    """bench computes no scores; its --dtype help was the scoring commands' ('Scores are summed in float64')."""
    result = runner.invoke(app, ["bench", "--help"], terminal_width=200, env={"COLUMNS": "200"})
    flat = " ".join(result.output.replace("│", " ").split())
    start = flat.index("--dtype")
    assert "Scores" not in flat and "float32, bfloat16 or float16 (default: as saved)" in flat[start:start + 120]


@pytest.mark.parametrize("args, message", [
    (["--share", "0.5", "--compensate", "rearrange+tune"], "--compensate 'rearrange+tune'; allowed: none, rearrange"),
    (["--share", "0.5", "--target", "input"], "--target 'input'; allowed: residual, output"),
    (["--share", "1.5"], "--share 1.5; allowed: a number 0.0..1.0"),
    (["--units", "both", "--share", "1.5"], "--share 1.5; allowed: a number 0.0..1.0"),
    (["--units", "neurons", "--share", "-0.5"], "--share -0.5; allowed: a number 0.0..1.0"),
    (["--units", "both", "--share", "0.5", "--target", "input"], "--target 'input'; allowed: residual, output"),
    (["--units", "both", "--share", "0.5", "--no-bench"], "(or pass --val-data, or a smaller --batch-size)"),
])
def test_compress_errors_name_the_flags(tiny, tmp_path, args, message):
    """Errors named the library's arguments (method=..., target='input', share=1.5, 'None or a number')."""
    model, data = tiny
    out = tmp_path / "never"
    result = runner.invoke(app, ["compress", str(model), "--task", "classification", "--data", str(data),
                                 "--calib-data", str(data), "--allow-same-data", *args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    # a refusal after the unpruned model's evaluation follows its progress lines (headprune.progress)
    lines = [line for line in result.output.strip().splitlines() if not line.startswith("headprune: ")]
    assert lines == [f"error: {message}"] or (len(lines) == 1 and message in lines[0]), result.output
    assert "=" not in lines[0].split(";")[0] and "None" not in lines[0] and not out.exists()


def test_compress_both_finishes_into_a_new_directory(tiny, tmp_path):
    """`compress --units both` saved the pruned model into -o, then refused its own folder as 'not empty ... holds
    no headprune run', exit 2, the model left behind: the README's command never finished."""
    model, data = tiny
    out = tmp_path / "both"
    result = runner.invoke(app, ["compress", str(model), "--task", "classification", "--data", str(data),
                                 "--calib-data", str(data), "--allow-same-data", "--units", "both", "--share", "0.5",
                                 "--no-bench", "--batch-size", "4", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert {"run.json", "compress.json", "results.json", "report.html", "config.json"} <= {p.name for p in out.iterdir()}
    record = json.loads((out / "compress.json").read_text())
    reloaded = hp.load_pruned(out)
    kept = sum(len(h) for h in hp.kept_heads(reloaded).values())
    assert kept == sum(len(h) for h in record["kept_heads"].values()) < 8  # 2 sites x 4 heads before


@pytest.mark.parametrize("command, flag, value, message", [
    ("evaluate", "--heads-off", '{"encoder.7.self": [1]}', "--heads-off: unknown site 'encoder.7.self'; allowed: "
     "encoder.0.self, encoder.1.self"),
    ("evaluate", "--heads-off", '{"encoder.0.self": [4]}', "--heads-off['encoder.0.self']: head index 4 out of range"),
    ("prune", "--drop", '{"encoder.7.self": [1]}', "--drop: unknown site 'encoder.7.self'"),
    ("prune", "--drop", '{"encoder.1.self": [4]}', "--drop['encoder.1.self']: head index 4 out of range; allowed: "
     "integers 0..3"),
    ("prune", "--drop", '{"encoder.1.self": [-1]}', "--drop['encoder.1.self']: head index -1 out of range"),
])
def test_head_list_errors_name_the_flag(tiny, tmp_path, command, flag, value, message):
    """A wrong site or head index named the library's argument ('heads: unknown site', "dropped['...']")."""
    model, data = tiny
    out = tmp_path / "never"
    args = ["--task", "classification", "--data", str(data)] if command == "evaluate" else ["-o", str(out)]
    result = runner.invoke(app, [command, str(model), *args, flag, value])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [result.output.strip()] and message in result.output
    assert not out.exists()


def test_demo_ends_with_its_headline(readme_run):
    """The demo printed its seven steps and 'done: report.html' but never the perplexities it is about; its
    parameter row gives counts; and each number's label says what it is ('most harmful to mask: ... 37.06'
    did not say 37.06 is a perplexity). The README's `headprune demo --quick -o runs/quick`."""
    out = readme_run["where"] / "runs" / "quick"
    result = readme_run["commands"]["demo"]
    results = json.loads((out / "results.json").read_text())
    tail = result.stdout.strip().splitlines()[-len(results["headline"]) - 1:]
    assert tail[-1] == f"report: {Path('runs/quick') / 'report.html'}"
    for line, (label, value) in zip(tail, results["headline"], strict=False):
        assert line.startswith(label) and line.endswith(value)
    assert f"{results['perplexity']['unpruned']:.2f}" in tail[0]
    p = results["parameters"]  # the quick demo's row read '0.1M -> 0.0M' (a tiny model rounded away)
    assert dict(results["headline"])["parameters"] == f"{p['before']:,} -> {p['after']:,}" and p["after"] < p["before"]
    numbers = [label for label, value in results["headline"] if re.fullmatch(r"[\d.]+", value)]
    assert len(numbers) == 5 and all("perplexity" in label for label in numbers), results["headline"]
    ablation = json.loads((out / "ablation" / "results.json").read_text())
    worst = max(ablation["rows"], key=lambda r: r["damage"])
    act_one, act_two = results["headline"][:-2], results["headline"][-2:]  # the quick demo writes no GGUF files
    assert act_one[-1] == [f"perplexity with the most harmful head masked ({worst['site']} head "
                           f"{worst['head']})", f"{worst['score']:.2f}"]
    second = results["act_two"]  # act two's rows: headprune and FLAP at 20%, then after recovery
    assert act_two[0][1] == f"{second['headprune']['perplexity']:.2f} / {second['flap']['perplexity']:.2f}"
    assert "recovery" in act_two[1][0] and act_two[1][1] == f"{second['recovered']['perplexity']:.2f}"
    assert "held-out perplexity of the masked model, then of the pruned one" in result.stdout


def test_bench_tables_stay_aligned_with_long_model_names(tiny, tmp_path):
    """A model named by a long path (a .gguf file, 'name-pruned0.5') pushed every later column to the right."""
    from transformers import AutoTokenizer

    model, _ = tiny
    long = tmp_path / "a-model-directory-with-a-rather-long-name"
    hp.save_pruned(build("bert"), long, tokenizer=AutoTokenizer.from_pretrained(model))
    result = runner.invoke(app, ["bench", str(long), "--prune-fraction", "0.5", "--batch-sizes", "1,2", "--seq-len",
                                 "8", "--repeats", "1", "--warmup", "0", "--min-repeat-s", "0.001", "--no-memory",
                                 "-o", str(tmp_path / "bench")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # an encoder caches no keys or values: its bench prints no KV-cache table (issue 36: no "0 -> 0 bytes")
    assert not any(line.startswith("model") and "KV cache B/token" in line for line in lines), result.stdout
    for column, value_of in (("batch", lambda row: row.split()[1]),):
        header = next(i for i, line in enumerate(lines) if line.startswith("model") and column in line)
        end = lines[header].index(column) + len(column)
        rows = [line for line in lines[header + 1:] if line.startswith(long.name)]
        assert len(rows) >= 2
        for row in rows[:4 if column == "batch" else 2]:
            assert row[:end].endswith(value_of(row)), (lines[header], row)  # right-aligned under its header


def test_evaluate_prints_each_score_once(tiny):
    """evaluate printed 'accuracy: 0.8400  (n=200, ...)' and then 'accuracy: 0.8400' again among the other metrics."""
    model, data = tiny
    result = runner.invoke(app, ["evaluate", str(model), "--task", "classification", "--data", str(data)])
    assert result.exit_code == 0, result.output
    keys = [line.split(":")[0] for line in result.stdout.splitlines()]
    assert keys[0] == "accuracy" and len(keys) == len(set(keys)) and {"matthews", "signature"} <= set(keys)
    as_json = json.loads(runner.invoke(app, ["evaluate", str(model), "--task", "classification", "--data", str(data),
                                             "--json"]).stdout)
    # one format per metric across commands: accuracy x 100 with 2 decimals, as compress, ablate and curve print it
    assert result.stdout.splitlines()[0].startswith(f"accuracy: {100 * as_json['score']:.2f}  (n=")
