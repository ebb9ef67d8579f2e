"""lm-evaluation-harness on any model headprune loads (pruned or not, uneven shapes included), offline.

``lm_eval`` (the ``eval`` extra) takes a model object through its Hugging Face adapter
(``HFLM(pretrained=model, tokenizer=...)``): it only calls the model's forward, so a pruned model
whose layers have different head counts (which no stock config can describe) is scored like any
other. Tasks come from lm_eval's own registry or from local task YAMLs (``include_path``); a local
task reads its data with ``dataset_path: json`` and ``dataset_kwargs: {data_files: ...}``, so
nothing is downloaded. :func:`local_task_yaml` writes such a YAML for the two task shapes people
use most: multiple choice (``acc``) and perplexity over documents (``loglikelihood_rolling``:
word/byte perplexity, bits per byte).

The standard zero-shot suite (``hellaswag``, ``arc_easy``, ``arc_challenge``, ``piqa``, ``winogrande``,
``boolq``, ``openbookqa``) runs the same way with ``include_defaults=True`` wherever those data sets
can be downloaded or sit in the Hugging Face datasets cache (docs/llm_export.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from ..core.finite import check_finite_weights
from ..errors import ConfigError
from ..extras import require

KINDS = ("multiple_choice", "perplexity")


def harness_lm(model: nn.Module, tokenizer, *, batch_size: int = 1, max_length: int | None = None):
    """``lm_eval``'s Hugging Face adapter around ``model`` (in eval mode) and ``tokenizer``."""
    require("lm_eval", "lm-evaluation-harness")
    from lm_eval.models.huggingface import HFLM

    if tokenizer is None:
        raise ConfigError("tokenizer=None; allowed: the model's tokenizer (lm_eval tokenizes the tasks' text)")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r}; allowed: an integer >= 1")
    kwargs = {"max_length": max_length} if max_length is not None else {}
    return HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=batch_size, **kwargs)


def evaluate_harness(model: nn.Module, tokenizer, tasks: list[str], *, include_path: str | Path | None = None,
                     include_defaults: bool = False, limit: int | None = None, num_fewshot: int | None = None,
                     batch_size: int = 1, max_length: int | None = None, seed: int = 0) -> dict:
    """Run ``lm_eval.simple_evaluate`` on ``model``; returns ``{"results": {task: {metric: value}},
    "n_samples": ..., "versions": ..., "lm_eval": version}`` (JSON-ready; per-sample logs are not kept).

    ``include_path``: a directory (or YAML file) of local tasks; ``include_defaults``: also index
    lm_eval's built-in tasks (slow to index; their data must be reachable)."""
    lm_eval = require("lm_eval", "lm-evaluation-harness")
    from lm_eval.tasks import TaskManager

    if not tasks or not all(isinstance(t, str) and t for t in tasks):
        raise ConfigError(f"tasks={tasks!r}; allowed: a non-empty list of task names")
    if include_path is None and not include_defaults:
        raise ConfigError("include_path=None and include_defaults=False; allowed: a directory of task YAMLs, "
                          "or include_defaults=True for lm_eval's own tasks")
    if include_path is not None and not Path(include_path).exists():
        raise ConfigError(f"include_path {str(include_path)!r} does not exist")
    manager = TaskManager(include_path=str(include_path) if include_path is not None else None,
                          include_defaults=include_defaults)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(f"tasks {unknown}: not found; allowed: tasks in {include_path or 'lm_eval'} "
                          f"({', '.join(sorted(manager.all_tasks)[:20])}{' ...' if len(manager.all_tasks) > 20 else ''})")
    check_finite_weights(model)  # lm_eval would report the accuracy of a model that computes NaN
    out = lm_eval.simple_evaluate(model=harness_lm(model, tokenizer, batch_size=batch_size, max_length=max_length),
                                  tasks=list(tasks), task_manager=manager, limit=limit, num_fewshot=num_fewshot,
                                  log_samples=False, bootstrap_iters=0, random_seed=seed, numpy_random_seed=seed,
                                  torch_random_seed=seed, fewshot_random_seed=seed)
    results = {task: {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "alias"}
               for task, metrics in out["results"].items()}
    return {"results": results, "n_samples": out.get("n-samples", {}), "versions": out.get("versions", {}),
            "lm_eval": getattr(lm_eval, "__version__", "unknown")}


def local_task_yaml(directory: str | Path, name: str, data_file: str | Path, kind: str, *,
                    text: str = "text", question: str = "question", choices: str = "choices",
                    answer: str = "answer") -> Path:
    """Write ``directory/name.yaml``: an lm_eval task over the local JSON-lines ``data_file``.

    ``kind="multiple_choice"``: each row has ``question`` (context), ``choices`` (list of strings)
    and ``answer`` (index of the right choice); metrics ``acc`` and ``acc_norm``.
    ``kind="perplexity"``: each row has ``text`` (a document); metrics ``word_perplexity``,
    ``byte_perplexity`` and ``bits_per_byte``."""
    if kind not in KINDS:
        raise ConfigError(f"kind {kind!r}; allowed: {', '.join(KINDS)}")
    data = Path(data_file).resolve()
    if not data.is_file():
        raise ConfigError(f"data_file {str(data_file)!r} does not exist; expected a JSON-lines file")
    head = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test"}
    if kind == "multiple_choice":
        body = {"output_type": "multiple_choice", "doc_to_text": "{{" + question + "}}",
                "doc_to_choice": "{{" + choices + "}}", "doc_to_target": "{{" + answer + "}}",
                "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]}
    else:
        body = {"output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{" + text + "}}",
                "should_decontaminate": False,
                "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")]}
    path = Path(directory) / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in {**head, **body}.items()) + "\n", encoding="utf-8")
    return path
