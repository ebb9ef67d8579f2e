"""A recovery run as a directory: checkpoints while it trains, ``recover.json``, and the recovered model.

:func:`run_recover` loads the pruned model (the student, float32: the weights AdamW updates) and the
unpruned one (the teacher, in the compute dtype), cuts the text into windows (:func:`lm_blocks`), and
calls :func:`headprune.compression.recover.recover` with the run directory ``out`` for its checkpoints.
The directory is a :class:`~.rundir.RunDir`: its signature (both models' and the data's content
hashes, the settings that shape the result, the code) is compared when a rerun resumes, and another
run into it is refused in one line. Everything is checked before the directory is created. Once the
last step is checkpointed, the model is saved with :func:`headprune.save_pruned` into ``out/model``
(load it with :func:`headprune.load_pruned`); a rerun of a finished run only reports it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from ..compression.recover import (
    RecoverHooks,
    RecoverResult,
    RecoverSettings,
    check_pair,
    recover,
    split_blocks,
)
from ..core.io import load_model, load_tokenizer, save_pruned
from ..core.model.devices import resolve_device
from ..errors import ConfigError
from ..evaluation.build import check_model
from ..provenance import code_identity, model_sha256, versions
from .rundir import RunDir

MODEL = "model"  # the recovered model's directory inside the run directory


def lm_blocks(tokenizer, config, data: str, block_size: int) -> torch.Tensor:
    """``[N, block_size]`` token windows of the text file ``data`` (or ``builtin:pydoc``): the one place recovery
    cuts text, through the language-modelling evaluator, so its windows are the ones ``headprune evaluate
    --task lm`` scores (and start as they do)."""
    from ..evaluation.build import EvalOptions, TaskData, build_task

    return build_task("lm", tokenizer, config, TaskData(data), EvalOptions(block_size=block_size)).blocks


def run_recover(pruned_dir: str | Path, teacher_dir: str | Path, data: str, out: str | Path,
                settings: RecoverSettings, *, device: str | None = None, fresh: bool = False,
                report: Callable[[str], None] | None = None) -> tuple[Path, RecoverResult | None]:
    """Recover the pruned model in ``pruned_dir`` from the unpruned one in ``teacher_dir`` on the text ``data``,
    into the run directory ``out`` (new, or this run's to resume; ``fresh``: start over in it). Returns (the recovered model's directory,
    the result; None when ``out`` already held the finished run)."""
    from ..cli.identity import content_sha256

    device = resolve_device(device)
    student = load_model(pruned_dir, device=device, dtype=torch.float32)
    check_model("lm", student, str(pruned_dir))
    tokenizer = load_tokenizer(pruned_dir)
    if tokenizer is None:
        raise ConfigError(f"model directory {str(pruned_dir)!r} has no tokenizer; save one beside the model")
    teacher = load_model(teacher_dir, device=device, dtype=torch.bfloat16 if settings.dtype == "bfloat16"
                         else torch.float32)
    check_model("lm", teacher, str(teacher_dir))
    check_pair(student, teacher, tokenizer, load_tokenizer(teacher_dir), str(teacher_dir))
    train, held = split_blocks(lm_blocks(tokenizer, student.config, data, settings.block_size), settings)
    signature = {"command": "recover", "model": str(pruned_dir), "model_sha256": model_sha256(pruned_dir),
                 "teacher": str(teacher_dir), "teacher_sha256": model_sha256(teacher_dir), "data": str(data),
                 "data_sha256": content_sha256(data), "settings": settings.result_dict(), "code": code_identity(),
                 "versions": versions()}
    out = Path(out)
    run = RunDir(out, signature, fresh=fresh)
    try:
        if fresh:  # what an earlier run left goes before this one writes
            for old in [p for p in out.iterdir() if p.name == MODEL or p.name.startswith("checkpoint-")]:
                shutil.rmtree(old)
        elif (out / MODEL).is_dir():  # finished earlier: the model is there
            return out / MODEL, None
        run.write_json("signature.json", signature)  # the run's first file (run.json is written with it)
        result = recover(student, teacher, train, held, settings, directory=out, hooks=RecoverHooks(report=report))
        save_pruned(student.eval(), out / MODEL, tokenizer=tokenizer)
    finally:
        run.close()
    return out / MODEL, result
