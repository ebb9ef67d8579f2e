"""The epoch loop both trainers share: AdamW, the learning-rate schedule, logging, checkpoints, `final/`."""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import HeadpruneError
from ..progress import progress_bar
from .batching import epoch_seed
from .checkpoint import load_optimizer, save_checkpoint, write_json, write_log
from .job import Job


@dataclass
class TrainResult:
    """What a training call produced. `log` holds the same records as `train_log.jsonl`."""

    output_dir: Path
    final_dir: Path | None  # None when stop_after_epoch ended the call before the last epoch
    checkpoints: list[Path]  # epoch-1 ... epoch-k, oldest first
    log: list[dict]
    resumed_from_epoch: int  # 0: started from scratch
    seconds: float  # wall time of this call
    info: dict  # signature: task, sizes, data fingerprint, versions (also in run.json)
    model: Any = field(repr=False, default=None)
    tokenizer: Any = field(repr=False, default=None)


def _adamw(model: torch.nn.Module, s: Any) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.lr, betas=s.adam_betas, eps=s.adam_eps, foreach=False)


def fit(job: Job) -> TrainResult:
    t_call = time.perf_counter()
    s, out, model = job.settings, job.output_dir, job.model
    opt = _adamw(model, s)
    first, step, log = 1, 0, []
    if job.resume is not None:
        k, state = job.resume
        load_optimizer(opt, out / f"epoch-{k}" / "optimizer.safetensors")
        first, step, log = k + 1, state["global_step"], state["log"]
    else:  # a fresh run: nothing from an older run in this directory may pass for this one's
        shutil.rmtree(out / "final", ignore_errors=True)
    write_log(out, log)  # on resume, drops lines of an epoch that never got its checkpoint
    write_json(out / "run.json", job.info)
    last = s.epochs if job.stop_after_epoch is None else min(s.epochs, job.stop_after_epoch)
    for epoch in range(first, last + 1):
        torch.manual_seed(epoch_seed(s.seed, epoch))  # dropout
        batches = job.batches(epoch)
        model.train()
        t0, loss_sum, weight_sum, n_examples = time.perf_counter(), 0.0, 0, 0
        bar = progress_bar(batches, desc=f"epoch {epoch}/{s.epochs}", unit="batch", show=s.progress)
        for idx in bar:
            step += 1
            lr = s.lr * job.lr_factor(step)
            for g in opt.param_groups:
                g["lr"] = lr
            loss, weight, n = job.loss(model, idx)
            if not math.isfinite(loss.item()):
                raise HeadpruneError(f"the training loss is {loss.item()} at step {step} (epoch {epoch}): "
                                     f"lower settings.lr (now {s.lr}) or raise the warm-up")
            loss.backward()
            if s.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_sum += loss.item() * weight
            weight_sum += weight
            n_examples += n
            bar.set_postfix(loss=f"{loss_sum / weight_sum:.4f}", lr=f"{lr:.2e}", refresh=False)
        seconds = time.perf_counter() - t0
        record = {"epoch": epoch, "global_step": step, "loss": loss_sum / max(weight_sum, 1), "lr": lr,
                  "seconds": round(seconds, 3), "examples_per_s": round(n_examples / seconds, 2)}
        if job.task == "translation":
            record["tokens_per_s"] = round(weight_sum / seconds, 1)
        if job.evaluate is not None:
            t1 = time.perf_counter()
            record.update(job.evaluate(model))
            record["eval_seconds"] = round(time.perf_counter() - t1, 3)
        log.append(record)
        save_checkpoint(job, opt, epoch, step, log)
        write_log(out, log)
    final = None
    if last == s.epochs:
        final = out / "final"
        tmp = out / "final.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(out / f"epoch-{s.epochs}", tmp,
                        ignore=shutil.ignore_patterns("optimizer.safetensors", "trainer_state.json"))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    model.eval()
    return TrainResult(output_dir=out, final_dir=final, log=log,
                       checkpoints=[out / f"epoch-{e}" for e in range(1, last + 1)],
                       resumed_from_epoch=first - 1, seconds=time.perf_counter() - t_call,
                       info=job.info, model=model, tokenizer=job.tokenizer)
