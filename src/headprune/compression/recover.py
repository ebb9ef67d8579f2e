"""Recovery: distil a pruned language model from the unpruned one over many tokens, resumably.

The pruned ``student`` is trained towards the unpruned ``teacher`` with the loss of :mod:`.distill`
(``KL(teacher || student)`` of the next-token softmax, no labels read; optionally plus the hidden
states' mismatch, ``hidden_weight``), on windows of a text cut once into blocks
(:func:`lm_blocks`, the same blocks :class:`~headprune.evaluation.lm.LanguageModelling` evaluates).
The last ``held_out_blocks`` blocks are never trained on: they choose the learning rate
(``lr="auto"``: each value of ``lr_grid`` trains a copy for ``lr_steps`` steps, the lowest held-out
loss wins) and give the held-out perplexity every ``eval_every`` tokens. AdamW (no weight decay) with
a learning rate decaying linearly to 0 over the run; the models stay in eval mode (no dropout).

Resuming. With a ``directory``, a checkpoint ``checkpoint-<step>/`` is written every
``checkpoint_every`` seconds and after the last step: the trained weights, AdamW's moments
(safetensors, no pickle), the random generators' states and ``state.json`` (step, data position,
chosen learning rate, losses, evaluations). It is written under a ``.tmp`` name and renamed, so a kill
never leaves a half checkpoint; older ones are removed after. The batch of step ``i`` is a pure
function of (``seed``, ``i``): a run started again from its newest checkpoint ends with the same
weights, bit for bit, as one never interrupted (same machine, device and torch). ``recover.json``
beside them is the log (evaluations, losses, the learning rate's choice), rewritten atomically.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import re
import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..checks import check_int, check_number, is_number
from ..core.model.chunked import token_outputs
from ..core.model.devices import input_device
from ..errors import ConfigError, DataError
from ..safefiles import read_text, write_atomic
from ..train.checkpoint import load_optimizer, save_optimizer
from .distill import distill_loss, train_step, trainable

OBJECTIVES = ("distill", "lm")
DTYPES = {"float32": None, "bfloat16": torch.bfloat16}  # compute dtype -> autocast dtype (None: off)
LOG = "recover.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")


@dataclass(frozen=True)
class RecoverSettings:
    """How a pruned model is recovered; every field but the last two shapes the result (a resume compares them)."""

    tokens: int  # training tokens; rounded down to whole steps of block_size x batch_size
    block_size: int = 256  # tokens per window
    batch_size: int = 4  # windows per step
    lr: float | str = "auto"  # peak learning rate, or "auto": the best of lr_grid on the held-out blocks
    lr_grid: tuple[float, ...] = (1e-5, 3e-5, 1e-4, 3e-4)
    lr_steps: int = 4  # steps of each trial of lr="auto" (its lr decays to 0 over them)
    held_out_blocks: int = 8  # the last blocks of the text: never trained on
    eval_every: int | None = None  # tokens between held-out evaluations (None: at the start and the end only)
    hidden_weight: float = 0.0  # weight of the hidden states' mismatch beside the KL (0: logits only)
    objective: str = "distill"  # distill: KL to the teacher's next-token softmax | lm: the text's own cross-entropy
    train_only: str | None = None  # a regular expression: only parameters whose names match it train (None: all)
    dtype: str = "float32"  # compute dtype of the forward passes (bfloat16: autocast; weights stay float32)
    seed: int = 0  # the order of the training blocks
    checkpoint_every: float = 300.0  # seconds between checkpoints (0: after every step); not part of the result
    progress_every: float = 30.0  # seconds between progress lines at most; not part of the result

    RESULT_FREE = ("checkpoint_every", "progress_every")

    def __post_init__(self):
        check_int("tokens", self.tokens, 1)
        check_int("block_size", self.block_size, 2)
        check_int("batch_size", self.batch_size, 1)
        if self.tokens < self.tokens_per_step:
            raise ConfigError(f"tokens={self.tokens}; allowed: an integer >= block_size x batch_size = "
                              f"{self.block_size} x {self.batch_size} = {self.tokens_per_step} (one step)")
        if not (self.lr == "auto" or (is_number(self.lr) and not isinstance(self.lr, str) and self.lr > 0)):
            raise ConfigError(f"lr={self.lr!r}; allowed: a finite number > 0, or 'auto'")
        object.__setattr__(self, "lr_grid", tuple(self.lr_grid))
        if not self.lr_grid or not all(is_number(v) and v > 0 for v in self.lr_grid):
            raise ConfigError(f"lr_grid={list(self.lr_grid)!r}; allowed: one or more finite numbers > 0")
        check_int("lr_steps", self.lr_steps, 1)
        if self.lr == "auto" and self.lr_steps > self.steps:
            raise ConfigError(f"lr_steps={self.lr_steps}; allowed: at most the run's {self.steps} steps")
        check_int("held_out_blocks", self.held_out_blocks, 1)
        check_int("eval_every", self.eval_every, self.tokens_per_step, optional=True)
        check_number("hidden_weight", self.hidden_weight, low=0)
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective={self.objective!r}; allowed: {', '.join(OBJECTIVES)}")
        if self.objective == "lm" and self.hidden_weight:
            raise ConfigError(f"hidden_weight={self.hidden_weight}; allowed: 0 with objective='lm' (no teacher states)")
        if self.train_only is not None:
            try:
                re.compile(self.train_only)
            except (re.error, TypeError) as e:
                raise ConfigError(f"train_only={self.train_only!r}; allowed: a regular expression ({e})") from None
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}; allowed: {', '.join(DTYPES)}")
        check_int("seed", self.seed, 0)
        check_number("checkpoint_every", self.checkpoint_every, low=0)
        check_number("progress_every", self.progress_every, low=0)

    @property
    def tokens_per_step(self) -> int:
        return self.block_size * self.batch_size

    @property
    def steps(self) -> int:
        return self.tokens // self.tokens_per_step

    def result_dict(self) -> dict:
        """The fields that shape the result, as JSON (what a resume must find unchanged)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if k not in self.RESULT_FREE}


@dataclass(frozen=True)
class RecoverHooks:
    """What a caller hears during :func:`recover`: ``report(line)`` a progress line at most every
    ``progress_every`` seconds; ``on_checkpoint(step)`` after each checkpoint is in place; ``on_evaluation(step)``
    after each held-out evaluation (step 0 included), with the student as it is at that step."""

    report: Callable[[str], None] | None = None
    on_checkpoint: Callable[[int], None] | None = None
    on_evaluation: Callable[[int], None] | None = None


@dataclass
class RecoverResult:
    """``log``: what ``recover.json`` holds (losses per step, evaluations, the learning rate's choice);
    ``resumed_from``: the step the run started at (0: from scratch)."""

    log: dict
    resumed_from: int
    seconds: float  # wall time of this call
    checkpoints: list[int] = field(default_factory=list)  # steps checkpointed by this call


def split_blocks(blocks: torch.Tensor, settings: RecoverSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """(training blocks, held-out blocks): the held-out ones are the last ``held_out_blocks``."""
    n, held = blocks.shape[0], settings.held_out_blocks
    if n - held < settings.batch_size:
        raise DataError(f"the text gives {n} blocks of {settings.block_size} tokens: {held} held out leave "
                        f"{n - held}, fewer than one batch of {settings.batch_size}; allowed: more text, a smaller "
                        "block_size, batch_size or held_out_blocks")
    return blocks[: n - held], blocks[n - held:]


def block_order(n_blocks: int, steps: int, batch_size: int, seed: int) -> torch.Tensor:
    """Indices of the training blocks in the order the steps read them ([steps x batch_size]): passes over the
    blocks, each a permutation drawn from ``seed``; a pure function, so step ``i`` reads the same blocks after a
    resume."""
    g = torch.Generator().manual_seed(seed)
    need = steps * batch_size
    passes = [torch.randperm(n_blocks, generator=g) for _ in range(-(-need // n_blocks))]
    return torch.cat(passes)[:need]


def recover(student: nn.Module, teacher: nn.Module, train_blocks: torch.Tensor, held_blocks: torch.Tensor,
            settings: RecoverSettings, *, directory: str | Path | None = None,
            hooks: RecoverHooks | None = None) -> RecoverResult:
    """Train ``student`` in place towards ``teacher`` on ``train_blocks`` ([N, T] token ids) for
    ``settings.steps`` steps (see the module doc); ``held_blocks`` ([M, T]) are evaluated, never trained on.

    ``directory``: where checkpoints and ``recover.json`` go; the newest checkpoint there is resumed (one
    written with other settings is refused). ``hooks``: progress lines, checkpoints and evaluations as they happen.
    """
    if not isinstance(settings, RecoverSettings):
        raise ConfigError(f"settings={type(settings).__name__}; allowed: a RecoverSettings")
    for name, blocks in (("train_blocks", train_blocks), ("held_blocks", held_blocks)):
        if not torch.is_tensor(blocks) or blocks.dim() != 2 or blocks.shape[0] == 0 or blocks.is_floating_point():
            raise ConfigError(f"{name}: expected token ids [N >= 1, T], got "
                              f"{tuple(blocks.shape) if torch.is_tensor(blocks) else type(blocks).__name__}")
    if train_blocks.shape[0] < settings.batch_size:
        raise DataError(f"train_blocks: {train_blocks.shape[0]} blocks, fewer than one batch of {settings.batch_size}")
    check_pair(student, teacher)
    run = _Run(student, teacher, train_blocks, held_blocks, settings, directory)
    return run.go(hooks or RecoverHooks())


def check_pair(student: nn.Module, teacher: nn.Module, student_tokenizer=None, teacher_tokenizer=None,
               teacher_name: str = "the teacher") -> None:
    """Refuse a teacher whose vocabulary is not the student's: another output size, or (both tokenizers given)
    another token-to-id table; the KL compares the two distributions id by id."""
    t_vocab, s_vocab = _vocab(teacher), _vocab(student)
    if t_vocab != s_vocab:
        raise ConfigError(f"teacher {teacher_name!r}: a vocabulary of {t_vocab} tokens, the pruned model's has "
                          f"{s_vocab}; allowed: the unpruned model the pruned one was cut from (the same vocabulary)")
    if student_tokenizer is not None and teacher_tokenizer is not None and \
            student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise ConfigError(f"teacher {teacher_name!r}: its tokenizer maps tokens to other ids than the pruned "
                          "model's; allowed: the unpruned model the pruned one was cut from (the same tokenizer)")


def _vocab(model: nn.Module) -> int | None:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else getattr(model.config, "vocab_size", None)


class _Run:
    """One call of :func:`recover`: the models, the data, the optimizer and the log it checkpoints."""

    def __init__(self, student, teacher, train_blocks, held_blocks, settings: RecoverSettings, directory):
        self.student, self.teacher, self.s = student, teacher, settings
        self.train_blocks, self.held_blocks = train_blocks, held_blocks
        self.directory = None if directory is None else Path(directory)
        self.order = block_order(train_blocks.shape[0], settings.steps, settings.batch_size, settings.seed)
        dtype = DTYPES[settings.dtype]
        device = input_device(student)
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else nullcontext
        self.checkpoints: list[int] = []

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        b = self.s.batch_size
        x = self.train_blocks[self.order[step * b: (step + 1) * b]]  # [B, T]
        return {"input_ids": x, "attention_mask": torch.ones_like(x)}

    def loss(self, model: nn.Module, step: int) -> torch.Tensor:
        with self.autocast():
            if self.s.objective == "lm":
                return text_loss(model, self.batch(step))
            return distill_loss(model, self.teacher, self.batch(step), hidden_weight=self.s.hidden_weight)

    @torch.no_grad()
    def held_out(self, model: nn.Module) -> float:
        """Mean next-token loss of ``model`` over the held-out blocks."""
        total, count = 0.0, 0
        for i in range(0, self.held_blocks.shape[0], self.s.batch_size):
            with self.autocast():
                nll = token_nll(model, self.held_blocks[i: i + self.s.batch_size])  # [B, T-1]
            total, count = total + float(nll.double().sum()), count + nll.numel()
        return total / count

    def go(self, hooks: RecoverHooks) -> RecoverResult:
        start = time.perf_counter()
        self.hooks = hooks
        with trainable(self.student, self.teacher, self.s.train_only) as params:
            self.opt = torch.optim.AdamW(params, lr=1.0, weight_decay=0.0)  # lr set per step
            try:
                state = self.resume()
                first = state["step"] if state else 0
                if state is None:
                    self.log = self.fresh_log()
                self.train(first, start)
            finally:
                self.opt.zero_grad(set_to_none=True)
        return RecoverResult(log=self.log, resumed_from=first, seconds=time.perf_counter() - start,
                             checkpoints=self.checkpoints)

    def fresh_log(self) -> dict:
        s = self.s
        log = {"settings": s.result_dict(), "steps": s.steps, "tokens": s.steps * s.tokens_per_step,
               "tokens_per_step": s.tokens_per_step, "train_blocks": self.train_blocks.shape[0],
               "held_out_blocks": self.held_blocks.shape[0],
               "passes": s.steps * s.batch_size / self.train_blocks.shape[0], "step": 0, "seconds": 0.0,
               "teacher_held_out": _loss_record(self.held_out(self.teacher)), "losses": [], "evals": [],
               "done": False}
        log["lr_selection"] = self.choose_lr() if s.lr == "auto" else None
        log["lr"] = log["lr_selection"]["chosen"] if s.lr == "auto" else s.lr
        log["evals"].append(self.evaluation(0, 0.0))
        return log

    def choose_lr(self) -> dict:
        """Each lr of the grid trains a copy of the student for ``lr_steps`` steps; the lowest held-out loss wins."""
        grid = {repr(float(lr)): self.trial(float(lr)) for lr in self.s.lr_grid}
        finite = {k: v for k, v in grid.items() if math.isfinite(v["held_out_loss"])}
        if not finite:
            raise ConfigError(f"lr_grid={list(self.s.lr_grid)}: every value diverged; allowed: smaller values")
        chosen = min(finite, key=lambda k: finite[k]["held_out_loss"])
        return {"grid": grid, "steps": self.s.lr_steps, "chosen": float(chosen),
                "on": "the held-out blocks (the same blocks as the evaluations)"}

    def trial(self, lr: float) -> dict:
        """A copy of the student trained ``lr_steps`` steps at ``lr`` (decaying to 0): its losses, held-out loss."""
        model, steps = copy.deepcopy(self.student), self.s.lr_steps
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
        losses = [train_step(opt, functools.partial(self.loss, model, i), lr * (1 - i / steps)) for i in range(steps)]
        held = self.held_out(model) if all(map(math.isfinite, losses)) else math.inf
        return {"losses": losses, **_loss_record(held)}

    def evaluation(self, step: int, seconds: float) -> dict:
        out = {"step": step, "tokens": step * self.s.tokens_per_step, "seconds": round(seconds, 3),
               **_loss_record(self.held_out(self.student))}
        if self.hooks.on_evaluation is not None:
            self.hooks.on_evaluation(step)
        return out

    def train(self, first: int, start: float) -> None:
        s, log = self.s, self.log
        report, on_checkpoint = self.hooks.report, self.hooks.on_checkpoint
        earlier, last_report, last_saved = log["seconds"], start, time.perf_counter()
        for step in range(first, s.steps):
            loss = train_step(self.opt, functools.partial(self.loss, self.student, step), log["lr"] * (1 - step / s.steps))
            if not math.isfinite(loss):
                raise ConfigError(f"recovery diverged (loss {loss}) at step {step + 1} with lr={log['lr']:g}; allowed: "
                                  "a smaller lr")
            log["losses"].append(loss)
            log["step"], log["seconds"] = step + 1, earlier + time.perf_counter() - start
            if s.eval_every and (step + 1) * s.tokens_per_step // s.eval_every > step * s.tokens_per_step // s.eval_every:
                log["evals"].append(self.evaluation(step + 1, log["seconds"]))
                self.write_log()
            now = time.perf_counter()
            if report is not None and (now - last_report >= s.progress_every or step + 1 == s.steps):
                report(progress_line(log, step + 1 - first, now - start))
                last_report = now
            if step + 1 == s.steps and log["evals"][-1]["step"] != s.steps:
                log["evals"].append(self.evaluation(s.steps, log["seconds"]))
            if self.directory is not None and (now - last_saved >= s.checkpoint_every or step + 1 == s.steps):
                log["done"] = step + 1 == s.steps
                self.save_checkpoint(step + 1)
                last_saved = time.perf_counter()
                if on_checkpoint is not None:
                    on_checkpoint(step + 1)
        log["done"] = True
        self.write_log()

    def write_log(self) -> None:
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)  # an evaluation may come before the first checkpoint
            write_atomic(self.directory / LOG, json.dumps(self.log, indent=1))

    def save_checkpoint(self, step: int) -> None:
        """``checkpoint-<step>/``, written under ``.tmp`` and renamed; older checkpoints removed after."""
        if self.directory is None:
            raise ConfigError("save_checkpoint: this recovery has no directory; allowed: recover(..., directory=DIR)")
        tmp = self.directory / f"checkpoint-{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({n: p.detach().cpu().contiguous() for n, p in self.student.named_parameters()},
                  str(tmp / "weights.safetensors"))
        save_optimizer(self.opt, tmp / "optimizer.safetensors")
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng |= {f"cuda.{i}": t for i, t in enumerate(torch.cuda.get_rng_state_all())}
        save_file(rng, str(tmp / "rng.safetensors"))
        state = {"step": step, "data_position": step * self.s.batch_size, "settings": self.s.result_dict(),
                 "python_random": _plain_state(random.getstate()), "log": self.log}
        write_atomic(tmp / "state.json", json.dumps(state))
        dest = self.directory / f"checkpoint-{step}"
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        for old in _checkpoints(self.directory):
            if old < step:
                shutil.rmtree(self.directory / f"checkpoint-{old}", ignore_errors=True)
        self.checkpoints.append(step)
        self.write_log()

    def resume(self) -> dict | None:
        """The newest checkpoint's state, loaded into the student, the optimizer and the generators (None: none)."""
        if self.directory is None or not self.directory.is_dir():
            return None
        found = _checkpoints(self.directory)
        if not found:
            return None
        where = self.directory / f"checkpoint-{max(found)}"
        state = json.loads(read_text(where / "state.json"))
        then, now = state.get("settings", {}), self.s.result_dict()
        diff = sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))
        if diff:
            raise ConfigError(f"{str(self.directory)!r} holds a recovery with other settings: "
                              + ", ".join(f"{k}={then.get(k)!r} there, {now.get(k)!r} now" for k in diff)
                              + "; allowed: the same settings (to resume) or another directory")
        params = dict(self.student.named_parameters())
        weights = load_file(str(where / "weights.safetensors"))
        if set(weights) != set(params) or any(weights[k].shape != params[k].shape for k in weights):
            raise ConfigError(f"{str(where)!r} holds the weights of another model; allowed: the pruned model it "
                              "was written for (or another directory)")
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value)
        load_optimizer(self.opt, where / "optimizer.safetensors")
        rng = load_file(str(where / "rng.safetensors"))
        torch.set_rng_state(rng["torch"])
        cuda = [rng[f"cuda.{i}"] for i in range(len(rng) - 1) if f"cuda.{i}" in rng]
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(_tuple_state(state["python_random"]))
        self.log = state["log"]
        return state


def token_nll(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``model``'s next-token losses ([B, T-1]) on the token ids ``ids`` ([B, T]), chunk by chunk over the vocabulary."""
    x = ids.to(input_device(model))
    return token_outputs(model, {"input_ids": x, "attention_mask": torch.ones_like(x)}).shifted().token_nll(x[:, 1:])


def text_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The mean next-token cross-entropy of ``model`` on the batch's own text (objective ``lm``)."""
    return token_nll(model, batch["input_ids"]).mean()


def _checkpoints(directory: Path) -> list[int]:
    """Steps of the complete checkpoints in ``directory`` (renamed into place, state.json present)."""
    return [int(m[1]) for p in directory.iterdir()
            if (m := CHECKPOINT.fullmatch(p.name)) and (p / "state.json").is_file()]


def _loss_record(loss: float) -> dict:
    return {"held_out_loss": loss, "held_out_perplexity": math.exp(loss) if loss < 700 else math.inf}


def _plain_state(value):
    return [_plain_state(v) for v in value] if isinstance(value, tuple) else value


def _tuple_state(value):
    return tuple(_tuple_state(v) for v in value) if isinstance(value, list) else value


def progress_line(log: dict, steps_here: int, seconds_here: float) -> str:
    """``recover: 12,288/100,352 tokens (12%), 410 tokens/s, 0:00:30 elapsed`` (tokens/s of this process)."""
    done, total = log["step"] * log["tokens_per_step"], log["tokens"]
    rate = steps_here * log["tokens_per_step"] / max(seconds_here, 1e-9)
    elapsed = int(log["seconds"])
    return (f"recover: {done:,}/{total:,} tokens ({done / total:.0%}), {rate:,.0f} tokens/s, "
            f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d} elapsed")
