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
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..checks import check_int
from ..core.model.finite import check_finite_weights
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


@dataclass(frozen=True)
class HarnessSettings:
    """lm-evaluation-harness's options: where its tasks are indexed, how many documents, shots and requests."""

    include_path: str | Path | None = None  # a directory (or YAML file) of local tasks
    include_defaults: bool = False  # also index lm_eval's built-in tasks (slow to index; their data must be reachable)
    limit: int | float | None = None  # documents per task (None: all)
    num_fewshot: int | None = None  # few-shot examples (None: the task's)
    batch_size: int = 1  # requests per forward
    max_length: int | None = None  # of the Hugging Face adapter (None: its default)
    seed: int = 0  # every lm_eval random generator's

    def __post_init__(self) -> None:
        if self.include_path is None and not self.include_defaults:
            raise ConfigError("include_path=None and include_defaults=False; allowed: a directory of task YAMLs, "
                              "or include_defaults=True for lm_eval's own tasks")
        if self.include_path is not None and not Path(self.include_path).exists():
            raise ConfigError(f"include_path {str(self.include_path)!r} does not exist")
        check_int("batch_size", self.batch_size, 1)
        check_int("num_fewshot", self.num_fewshot, 0, optional=True)
        check_int("max_length", self.max_length, 1, optional=True)
        check_int("seed", self.seed, 0)


def evaluate_harness(model: nn.Module, tokenizer, tasks: list[str], settings: HarnessSettings) -> dict:
    """Run ``lm_eval.simple_evaluate`` on ``model`` under ``settings``; returns ``{"results": {task: {metric:
    value}}, "n_samples": ..., "versions": ..., "lm_eval": version}`` (JSON-ready; per-sample logs are not kept)."""
    lm_eval = require("lm_eval", "lm-evaluation-harness")
    from lm_eval.tasks import TaskManager

    if not tasks or not all(isinstance(t, str) and t for t in tasks):
        raise ConfigError(f"tasks={tasks!r}; allowed: a non-empty list of task names")
    if not isinstance(settings, HarnessSettings):
        raise ConfigError(f"settings: expected a HarnessSettings, got {type(settings).__name__}")
    s, include_path = settings, settings.include_path
    manager = TaskManager(include_path=str(include_path) if include_path is not None else None,
                          include_defaults=s.include_defaults)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(f"tasks {unknown}: not found; allowed: tasks in {include_path or 'lm_eval'} "
                          f"({', '.join(sorted(manager.all_tasks)[:20])}{' ...' if len(manager.all_tasks) > 20 else ''})")
    check_finite_weights(model)  # lm_eval would report the accuracy of a model that computes NaN
    out = lm_eval.simple_evaluate(model=harness_lm(model, tokenizer, batch_size=s.batch_size, max_length=s.max_length),
                                  tasks=list(tasks), task_manager=manager, limit=s.limit, num_fewshot=s.num_fewshot,
                                  log_samples=False, bootstrap_iters=0, random_seed=s.seed, numpy_random_seed=s.seed,
                                  torch_random_seed=s.seed, fewshot_random_seed=s.seed)
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
