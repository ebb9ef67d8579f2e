"""``headprune lm-eval``: lm-evaluation-harness tasks on a model headprune loads (pruned or not), offline.

headprune lm-eval MODEL --tasks TASK[,TASK] --include-path TASK_DIR [--limit N] [-o results.json]
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..errors import ConfigError
from ..provenance import own_name
from .app import app, friendly


@app.command("lm-eval")
@friendly
def lm_eval_command(
    model_dir: Path = typer.Argument(..., help="A model directory (pruned by headprune or not) or a .gguf file."),
    tasks: str = typer.Option(..., "--tasks", help="Comma-separated lm_eval task names."),
    include_path: Path = typer.Option(None, "--include-path", help="Directory of local task YAMLs "
                                      "(dataset_path: json + data_files: nothing is downloaded); default: none, "
                                      "then --defaults is needed."),
    defaults: bool = typer.Option(False, "--defaults", help="Also index lm_eval's built-in tasks (their data must "
                                  "be downloadable or in the datasets cache)."),
    limit: int = typer.Option(None, "--limit", help="Documents per task (default: all)."),
    num_fewshot: int = typer.Option(None, "--num-fewshot", help="Few-shot examples (default: the task's)."),
    batch_size: int = typer.Option(1, "--batch-size", help="Requests per forward."),
    output: Path = typer.Option(None, "-o", "--output", help="Write the results as JSON to this new file "
                                  "(default: print only)."),
):
    """Score the model with lm-evaluation-harness (its Hugging Face adapter around the loaded model)."""
    from ..core import load_model, load_tokenizer
    from ..evaluation.harness import HarnessSettings, evaluate_harness

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        raise ConfigError(f"--tasks {tasks!r}; allowed: comma-separated task names")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit {limit}; allowed: an integer >= 1")
    if output is not None and output.exists():
        raise ConfigError(f"--output {str(output)!r} already exists; allowed: a new file")
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        raise ConfigError(f"model {str(model_dir)!r} has no tokenizer; lm_eval needs one")
    settings = HarnessSettings(include_path=include_path, include_defaults=defaults, limit=limit,
                               num_fewshot=num_fewshot, batch_size=batch_size)
    out = evaluate_harness(load_model(model_dir), tokenizer, names, settings)
    out["signature"] = {"model": own_name(model_dir), "tasks": names, "limit": limit, "num_fewshot": num_fewshot}
    for task, metrics in out["results"].items():
        typer.echo(f"{task}: " + ", ".join(f"{k.split(',')[0]} {v:.4g}" for k, v in metrics.items()
                                           if not k.endswith("_stderr,none")))
    if output is not None:
        tmp = output.with_name(f".{output.name}.tmp")
        tmp.write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.rename(output)
