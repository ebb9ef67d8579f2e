"""Checkpoint files: `epoch-k/` (model, tokenizer, optimizer, trainer state), `run.json`, `train_log.jsonl`.

Files are written under a `.tmp` name and renamed, so an interrupted write never passes for a checkpoint.
The optimizer is saved as safetensors (AdamW's moments and step per parameter, no pickle).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from ..errors import ConfigError, DataError, HeadpruneError
from ..provenance import versions

if TYPE_CHECKING:
    from .job import Job

# settings a resumed run may change: they cannot change its result (see the `headprune.train` doc)
_RESUME_FREE = {"classifier": {"progress", "eval_batch_size"},
                "translation": {"progress", "eval_batch_size", "epochs"}}


def data_fingerprint(*parts: Any) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, ensure_ascii=False).encode())
    return h.hexdigest()


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)


def write_log(output_dir: Path, log: list[dict]) -> None:
    tmp = output_dir / "train_log.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in log))
    tmp.replace(output_dir / "train_log.jsonl")


def settings_json(settings: Any) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(settings)))


def find_resume(output_dir: Path, task: str, settings: Any, fingerprint: str) -> tuple[int, dict] | None:
    """The newest `epoch-k` holding both trainer_state.json and optimizer.safetensors, checked."""
    found = []
    for p in output_dir.glob("epoch-*"):
        m = re.fullmatch(r"epoch-(\d+)", p.name)
        if m and (p / "trainer_state.json").is_file() and (p / "optimizer.safetensors").is_file():
            found.append(int(m.group(1)))
    if not found:
        return None
    k = max(found)
    state = json.loads((output_dir / f"epoch-{k}" / "trainer_state.json").read_text())
    if state.get("task") != task:
        raise ConfigError(f"output_dir {output_dir} holds a {state.get('task')!r} run, not {task!r}")
    if state.get("data_sha256") != fingerprint:
        raise DataError(f"output_dir {output_dir} holds a run on other data (fingerprint differs): "
                        "use another output_dir or delete it")
    now, then = settings_json(settings), state.get("settings", {})
    free = _RESUME_FREE[task]
    diff = sorted(n for n in set(now) | set(then) if n not in free and now.get(n) != then.get(n))
    if diff:
        raise ConfigError(f"output_dir {output_dir} holds a run with other settings: "
                          + ", ".join(f"{n}={then.get(n)!r} there, {now.get(n)!r} now" for n in diff))
    if k > settings.epochs:
        raise ConfigError(f"settings.epochs must be >= {k}: output_dir {output_dir} already holds epoch-{k}, "
                          f"got {settings.epochs}")
    return k, state


def save_optimizer(opt: torch.optim.Optimizer, path: Path) -> None:
    tensors = {}
    for idx, st in opt.state_dict()["state"].items():
        for name, value in st.items():
            if not torch.is_tensor(value):
                raise ConfigError(f"optimizer state {name!r} is not a tensor; only AdamW is supported")
            tensors[f"{idx}.{name}"] = value.detach().contiguous()
    save_file(tensors, str(path))


def load_optimizer(opt: torch.optim.Optimizer, path: Path) -> None:
    state: dict[int, dict] = defaultdict(dict)
    for key, value in load_file(str(path)).items():
        idx, name = key.split(".", 1)
        state[int(idx)][name] = value
    params = [p for g in opt.param_groups for p in g["params"]]  # state_dict numbers them in this order
    for idx, st in state.items():
        shape = tuple(st["exp_avg"].shape) if "exp_avg" in st else None
        if idx >= len(params) or shape != tuple(params[idx].shape):
            raise HeadpruneError(f"optimizer state in {path} does not fit the model (parameter {idx}): "
                                 "delete the checkpoint or use another output_dir")
    sd = opt.state_dict()  # param_groups (hyper-parameters) come from the current, identical settings
    sd["state"] = dict(state)
    opt.load_state_dict(sd)


def save_checkpoint(job: Job, opt: torch.optim.Optimizer, epoch: int, step: int, log: list[dict]) -> None:
    out = job.output_dir
    tmp, dest = out / f"epoch-{epoch}.tmp", out / f"epoch-{epoch}"
    shutil.rmtree(tmp, ignore_errors=True)
    job.model.save_pretrained(str(tmp))
    job.tokenizer.save_pretrained(str(tmp))
    save_optimizer(opt, tmp / "optimizer.safetensors")
    write_json(tmp / "trainer_state.json", {
        "task": job.task, "epoch": epoch, "global_step": step, "settings": settings_json(job.settings),
        "data_sha256": job.info["data_sha256"], "log": log, "versions": versions()})
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    older = out / f"epoch-{epoch - 1}" / "optimizer.safetensors"
    older.unlink(missing_ok=True)


def prepare_dir(output_dir: str | Path) -> Path:
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir must be a directory, got the file {out}")
    out.mkdir(parents=True, exist_ok=True)
    return out
