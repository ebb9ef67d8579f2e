"""Fine-tune a sequence classifier, or train a small translation model from scratch.

Both write ordinary Hugging Face directories: `output_dir/epoch-1`, `epoch-2`, ... and, once the last
epoch is done, `output_dir/final` (a plain copy, no symlink), each with the tokenizer, plus
`train_log.jsonl` (one JSON object per epoch) and `run.json` (the run's signature).

Determinism and resuming:
- Weights that start random (a classifier head, a translation model) are drawn right after
  `torch.manual_seed(seed)`.
- Epoch e draws its batch order from, and reseeds torch (dropout) with, a seed made of (seed, e), so
  no epoch depends on random state left by earlier ones.
- The learning rate is a pure function of the global step; there is no scheduler object to save.
- A checkpoint `epoch-k/` adds `optimizer.safetensors` (AdamW's moments and step per parameter, no
  pickle) and `trainer_state.json` (epoch, step, settings, data fingerprint, log so far).
So a rerun that finds `epoch-k` continues with epoch k+1 and ends, on the same machine and torch, with
the same weights bit for bit as an uninterrupted run. Only the newest checkpoint keeps its optimizer
file (it is twice the model's size). Resuming refuses other data or other settings, except fields
that cannot change the result (`progress`, `eval_batch_size`) and, for translation, `epochs` (its
schedule does not depend on the run's length; the classifier's linear decay does).
`torch.set_num_threads` is left to the caller.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoModelForSequenceClassification, AutoTokenizer, MarianConfig, MarianMTModel

from .errors import ConfigError, DataError, HeadpruneError
from .tokenizer import train_tokenizer

IGNORE = -100  # label id that cross_entropy skips (padding)
ACTIVATIONS = ("relu", "gelu", "swish", "silu")


# ---------------------------------------------------------------------------------------- settings
def _check(obj: Any, name: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{type(obj).__name__}.{name} must be {allowed}, got {getattr(obj, name)!r}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ints(obj: Any, names: Sequence[str], lo: int, *, none_ok: bool = False) -> None:
    for n in names:
        v = getattr(obj, n)
        _check(obj, n, (none_ok and v is None) or (_is_int(v) and v >= lo),
               f"{'None or ' if none_ok else ''}an int >= {lo}")


def _fractions(obj: Any, names: Sequence[str], *, one_ok: bool = False) -> None:
    for n in names:
        v = getattr(obj, n)
        ok = _is_num(v) and 0 <= v and (v <= 1 if one_ok else v < 1)
        _check(obj, n, ok, "a number in [0, 1]" if one_ok else "a number in [0, 1)")


def _check_common(s: Any) -> None:
    _ints(s, ("epochs", "eval_batch_size", "sort_chunk"), 1)
    _ints(s, ("max_length",), 2)
    _ints(s, ("seed",), 0)
    _check(s, "lr", _is_num(s.lr) and s.lr > 0, "a number > 0")
    _check(s, "adam_eps", _is_num(s.adam_eps) and s.adam_eps > 0, "a number > 0")
    _check(s, "weight_decay", _is_num(s.weight_decay) and s.weight_decay >= 0, "a number >= 0")
    g = s.max_grad_norm
    _check(s, "max_grad_norm", g is None or (_is_num(g) and g > 0), "None (no clipping) or a number > 0")
    b = s.adam_betas
    ok = isinstance(b, (tuple, list)) and len(b) == 2 and all(_is_num(x) and 0 <= x < 1 for x in b)
    _check(s, "adam_betas", ok, "two numbers in [0, 1)")
    s.adam_betas = (float(b[0]), float(b[1]))
    _check(s, "progress", isinstance(s.progress, bool), "a bool")


@dataclass
class ClassifierTrainSettings:
    """Fine-tuning a pretrained encoder: AdamW, linear warm-up then linear decay to zero."""

    epochs: int = 3
    batch_size: int = 32
    lr: float = 2e-5
    warmup_ratio: float = 0.1  # fraction of all steps spent warming up linearly from 0
    weight_decay: float = 0.01  # not applied to biases and LayerNorm weights (1-D parameters)
    max_grad_norm: float | None = 1.0  # clip the global gradient norm; None: no clipping
    max_length: int = 128  # tokens per example (pair) after truncation, specials included
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    seed: int = 0
    sort_chunk: int = 1024  # sort by length within random chunks of this many examples (1: no sorting)
    eval_batch_size: int = 64
    progress: bool = True  # tqdm bars on stderr

    def __post_init__(self) -> None:
        _check_common(self)
        _ints(self, ("batch_size",), 1)
        _fractions(self, ("warmup_ratio",), one_ok=True)


@dataclass
class TranslationTrainSettings:
    """A Marian-shaped (post-LN Transformer) encoder-decoder trained from scratch.

    Defaults are a small model for CPUs (3+3 layers, d_model 256, 4 heads); `iwslt()` gives the
    paper's IWSLT shape. AdamW with linear warm-up then inverse-square-root decay.
    """

    epochs: int = 10
    batch_size: int | None = 64  # examples per batch; exactly one of batch_size and max_tokens is set
    max_tokens: int | None = None  # padded tokens per batch: n * max(source, target length) <= max_tokens
    lr: float = 7e-4  # peak learning rate, reached at the end of the warm-up
    warmup_steps: int = 1000
    weight_decay: float = 1e-4
    max_grad_norm: float | None = 1.0
    label_smoothing: float = 0.1
    max_length: int = 128  # tokens incl. </s>; longer training pairs are skipped, eval sources truncated,
    # and it bounds max_new_tokens of the greedy decoding used for BLEU
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    vocab_size: int = 8000  # joint source+target vocabulary when the tokenizer is trained here
    tokenizer_kind: Literal["bpe", "unigram"] = "bpe"
    encoder_layers: int = 3
    decoder_layers: int = 3
    d_model: int = 256
    attention_heads: int = 4  # per attention site (encoder self, decoder self, cross)
    ffn_dim: int = 1024
    activation: str = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    seed: int = 0
    sort_chunk: int = 4096
    eval_batch_size: int = 64
    progress: bool = True

    @classmethod
    def iwslt(cls, **overrides: Any) -> TranslationTrainSettings:
        """Section 6's IWSLT model: 6+6 layers, 8 heads, d_model 512, FFN 1024 (fairseq's
        `transformer_iwslt_de_en` sizes), dropout 0.3, 4096 tokens per batch, 4000 warm-up steps."""
        shape = dict(encoder_layers=6, decoder_layers=6, d_model=512, attention_heads=8, ffn_dim=1024,
                     dropout=0.3, batch_size=None, max_tokens=4096, lr=5e-4, warmup_steps=4000,
                     vocab_size=10000)
        return cls(**{**shape, **overrides})

    def __post_init__(self) -> None:
        _check_common(self)
        _ints(self, ("batch_size", "max_tokens"), 1, none_ok=True)
        if (self.batch_size is None) == (self.max_tokens is None):
            raise ConfigError("TranslationTrainSettings: set exactly one of batch_size and max_tokens, "
                              f"got batch_size={self.batch_size!r}, max_tokens={self.max_tokens!r}")
        if self.max_tokens is not None:
            _check(self, "max_tokens", self.max_tokens >= self.max_length,
                   f"an int >= max_length ({self.max_length})")
        _ints(self, ("warmup_steps", "encoder_layers", "decoder_layers", "d_model", "attention_heads"), 1)
        _ints(self, ("ffn_dim",), 1)
        _check(self, "d_model", self.d_model % self.attention_heads == 0,
               f"a multiple of attention_heads ({self.attention_heads})")
        _ints(self, ("vocab_size",), 8)
        _check(self, "tokenizer_kind", self.tokenizer_kind in ("bpe", "unigram"), "'bpe' or 'unigram'")
        _check(self, "activation", self.activation in ACTIVATIONS, f"one of {ACTIVATIONS}")
        _fractions(self, ("label_smoothing", "dropout", "attention_dropout", "activation_dropout"))


_RESUME_FREE = {"classifier": {"progress", "eval_batch_size"},
                "translation": {"progress", "eval_batch_size", "epochs"}}


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


# ---------------------------------------------------------------------------------------- batching
def length_bucketed_batches(lengths: Sequence[int], *, rng: random.Random, sort_chunk: int,
                            batch_size: int | None = None, max_tokens: int | None = None) -> list[list[int]]:
    """Shuffle, sort by length inside chunks of `sort_chunk` examples, cut into batches, shuffle batches.

    Batches hold `batch_size` examples, or as many as keep n * (longest length) <= `max_tokens` (an
    example longer than `max_tokens` gets a batch of its own). Every index appears exactly once.
    """
    if (batch_size is None) == (max_tokens is None):
        raise ConfigError("set exactly one of batch_size and max_tokens, "
                          f"got batch_size={batch_size!r}, max_tokens={max_tokens!r}")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order = [i for start in range(0, len(order), sort_chunk)
             for i in sorted(order[start:start + sort_chunk], key=lambda i: lengths[i])]
    if batch_size is not None:
        batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    else:
        batches, batch, longest = [], [], 0
        for i in order:
            if batch and (len(batch) + 1) * max(longest, lengths[i]) > max_tokens:
                batches.append(batch)
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, lengths[i])
        if batch:
            batches.append(batch)
    rng.shuffle(batches)
    return batches


def _epoch_seed(seed: int, epoch: int) -> int:
    """One seed per (run seed, epoch): batch order and dropout of an epoch do not depend on the past."""
    return seed * 1_000_003 + epoch


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:  # -> [n, longest]
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


# ------------------------------------------------------------------------------- checkpoint files
def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("headprune", "torch", "transformers", "tokenizers", "sacrebleu"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def _fingerprint(*parts: Any) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, ensure_ascii=False).encode())
    return h.hexdigest()


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)


def _write_log(output_dir: Path, log: list[dict]) -> None:
    tmp = output_dir / "train_log.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in log))
    tmp.replace(output_dir / "train_log.jsonl")


def _settings_json(settings: Any) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(settings)))


def _find_resume(output_dir: Path, task: str, settings: Any, fingerprint: str) -> tuple[int, dict] | None:
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
    now, then = _settings_json(settings), state.get("settings", {})
    free = _RESUME_FREE[task]
    diff = sorted(n for n in set(now) | set(then) if n not in free and now.get(n) != then.get(n))
    if diff:
        raise ConfigError(f"output_dir {output_dir} holds a run with other settings: "
                          + ", ".join(f"{n}={then.get(n)!r} there, {now.get(n)!r} now" for n in diff))
    if k > settings.epochs:
        raise ConfigError(f"settings.epochs must be >= {k}: output_dir {output_dir} already holds epoch-{k}, "
                          f"got {settings.epochs}")
    return k, state


def _save_optimizer(opt: torch.optim.Optimizer, path: Path) -> None:
    tensors = {}
    for idx, st in opt.state_dict()["state"].items():
        for name, value in st.items():
            if not torch.is_tensor(value):
                raise ConfigError(f"optimizer state {name!r} is not a tensor; only AdamW is supported")
            tensors[f"{idx}.{name}"] = value.detach().contiguous()
    save_file(tensors, str(path))


def _load_optimizer(opt: torch.optim.Optimizer, path: Path) -> None:
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


def _adamw(model: torch.nn.Module, s: Any) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.lr, betas=s.adam_betas, eps=s.adam_eps, foreach=False)


# -------------------------------------------------------------------------------------- the loop
@dataclass
class _Job:
    """What differs between the tasks; `_fit` does the rest."""

    task: str
    model: Any
    tokenizer: Any
    settings: Any
    output_dir: Path
    info: dict
    resume: tuple[int, dict] | None
    batches: Callable[[int], list[list[int]]]  # epoch -> batches of example indices
    loss: Callable[[Any, list[int]], tuple[torch.Tensor, int, int]]  # -> (mean loss, weight, n examples)
    lr_factor: Callable[[int], float]  # 1-based global step -> multiplier of settings.lr
    evaluate: Callable[[Any], dict] | None
    stop_after_epoch: int | None


def _fit(job: _Job) -> TrainResult:
    t_call = time.perf_counter()
    s, out, model = job.settings, job.output_dir, job.model
    opt = _adamw(model, s)
    first, step, log = 1, 0, []
    if job.resume is not None:
        k, state = job.resume
        _load_optimizer(opt, out / f"epoch-{k}" / "optimizer.safetensors")
        first, step, log = k + 1, state["global_step"], state["log"]
    else:  # a fresh run: nothing from an older run in this directory may pass for this one's
        shutil.rmtree(out / "final", ignore_errors=True)
    _write_log(out, log)  # on resume, drops lines of an epoch that never got its checkpoint
    _write_json(out / "run.json", job.info)
    last = s.epochs if job.stop_after_epoch is None else min(s.epochs, job.stop_after_epoch)
    for epoch in range(first, last + 1):
        torch.manual_seed(_epoch_seed(s.seed, epoch))  # dropout
        batches = job.batches(epoch)
        model.train()
        t0, loss_sum, weight_sum, n_examples = time.perf_counter(), 0.0, 0, 0
        bar = tqdm(batches, desc=f"epoch {epoch}/{s.epochs}", unit="batch", disable=not s.progress)
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
        _save_checkpoint(job, opt, epoch, step, log)
        _write_log(out, log)
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


def _save_checkpoint(job: _Job, opt: torch.optim.Optimizer, epoch: int, step: int, log: list[dict]) -> None:
    out = job.output_dir
    tmp, dest = out / f"epoch-{epoch}.tmp", out / f"epoch-{epoch}"
    shutil.rmtree(tmp, ignore_errors=True)
    job.model.save_pretrained(str(tmp))
    job.tokenizer.save_pretrained(str(tmp))
    _save_optimizer(opt, tmp / "optimizer.safetensors")
    _write_json(tmp / "trainer_state.json", {
        "task": job.task, "epoch": epoch, "global_step": step, "settings": _settings_json(job.settings),
        "data_sha256": job.info["data_sha256"], "log": log, "versions": _versions()})
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    older = out / f"epoch-{epoch - 1}" / "optimizer.safetensors"
    older.unlink(missing_ok=True)


def _prepare_dir(output_dir: str | Path) -> Path:
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir must be a directory, got the file {out}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _check_texts(name: str, texts: Any, n: int | None = None) -> list[str]:
    if not isinstance(texts, (list, tuple)):
        raise DataError(f"{name} must be a list of str, got {type(texts).__name__}")
    if n is not None and len(texts) != n:
        raise DataError(f"{name} must have {n} items (one per text), got {len(texts)}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise DataError(f"{name}[{i}] must be a str, got {type(t).__name__}")
    return list(texts)


def _check_stop(stop_after_epoch: int | None) -> None:
    if stop_after_epoch is not None and not (_is_int(stop_after_epoch) and stop_after_epoch >= 1):
        raise ConfigError(f"stop_after_epoch must be None or an int >= 1, got {stop_after_epoch!r}")


# ------------------------------------------------------------------------------- classification
def finetune_classifier(
    model_dir_or_model: str | Path | Any,
    tokenizer: Any | None,
    texts: list[str],
    labels: list[int],
    *,
    settings: ClassifierTrainSettings,
    output_dir: str | Path,
    text_pairs: list[str] | None = None,
    eval_texts: list[str] | None = None,
    eval_labels: list[int] | None = None,
    eval_text_pairs: list[str] | None = None,
    label_names: list[str] | None = None,
    num_labels: int | None = None,
    stop_after_epoch: int | None = None,
) -> TrainResult:
    """Fine-tune an encoder for (pair) classification with cross-entropy; see the module doc.

    A directory is loaded with `AutoModelForSequenceClassification.from_pretrained(dir, num_labels=N)`
    (a fresh head drawn after `torch.manual_seed(seed)`), and its tokenizer when `tokenizer` is None.
    A model object is trained in place unless a checkpoint is resumed (then it is reloaded from there
    with `type(model).from_pretrained`). N is `len(label_names)`, else `num_labels`, else
    `max(labels) + 1`; `label_names` also set the config's `id2label`/`label2id`.
    `stop_after_epoch` ends this call early with a resumable checkpoint (no `final`).
    """
    s = settings
    if not isinstance(s, ClassifierTrainSettings):
        raise ConfigError(f"settings must be a ClassifierTrainSettings, got {type(s).__name__}")
    _check_stop(stop_after_epoch)
    texts = _check_texts("texts", texts)
    if not texts:
        raise DataError("texts must hold at least one example, got 0")
    pairs = None if text_pairs is None else _check_texts("text_pairs", text_pairs, len(texts))
    if label_names is not None:
        label_names = [str(x) for x in label_names]
        if num_labels is not None and num_labels != len(label_names):
            raise ConfigError(f"num_labels must equal len(label_names) ({len(label_names)}), "
                              f"got {num_labels}")
        num_labels = len(label_names)
    labels = _check_labels("labels", labels, len(texts), num_labels)
    n_labels = num_labels if num_labels is not None else max(labels) + 1
    if not _is_int(n_labels) or n_labels < 2:
        raise ConfigError(f"num_labels must be an int >= 2, got {n_labels!r}")
    has_eval = eval_texts is not None or eval_labels is not None
    if has_eval:
        if eval_texts is None or eval_labels is None:
            raise DataError("eval_texts and eval_labels must be given together")
        eval_texts = _check_texts("eval_texts", eval_texts)
        eval_labels = _check_labels("eval_labels", eval_labels, len(eval_texts), n_labels)
        if (eval_text_pairs is None) != (pairs is None):
            raise DataError("eval_text_pairs must be given exactly when text_pairs is")
        if eval_text_pairs is not None:
            eval_text_pairs = _check_texts("eval_text_pairs", eval_text_pairs, len(eval_texts))

    from_dir = isinstance(model_dir_or_model, (str, Path))
    if tokenizer is None:
        if not from_dir:
            raise ConfigError("tokenizer must be given when model_dir_or_model is a model object, got None")
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir_or_model))
    if tokenizer.pad_token_id is None:
        raise ConfigError("tokenizer must have a pad token (tokenizer.pad_token_id is None)")

    out = _prepare_dir(output_dir)
    fingerprint = _fingerprint(texts, pairs, labels, label_names, n_labels)
    resume = _find_resume(out, "classifier", s, fingerprint)
    torch.manual_seed(s.seed)
    label_kw: dict[str, Any] = {}
    if label_names is not None:
        label_kw = {"id2label": dict(enumerate(label_names)),
                    "label2id": {n: i for i, n in enumerate(label_names)}}
    if resume is not None:
        cls = AutoModelForSequenceClassification if from_dir else type(model_dir_or_model)
        model = cls.from_pretrained(str(out / f"epoch-{resume[0]}"))
    elif from_dir:
        model = AutoModelForSequenceClassification.from_pretrained(str(model_dir_or_model),
                                                                   num_labels=n_labels, **label_kw)
    else:
        model = model_dir_or_model
        if model.config.num_labels != n_labels:
            raise ConfigError(f"the model's config.num_labels must equal the number of labels ({n_labels}), "
                              f"got {model.config.num_labels}")
        for k, v in label_kw.items():
            setattr(model.config, k, v)
    model.config.problem_type = "single_label_classification"

    def encode(a: list[str], b: list[str] | None) -> list[dict[str, list[int]]]:
        enc = tokenizer(a, b, truncation=True, max_length=s.max_length)
        keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
        return [{k: enc[k][i] for k in keys} for i in range(len(a))]

    def collate(feats: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        pad_id = tokenizer.pad_token_id
        return {k: _pad([f[k] for f in feats], pad_id if k == "input_ids" else 0) for k in feats[0]}

    train = encode(texts, pairs)
    lengths = [len(f["input_ids"]) for f in train]
    y = torch.tensor(labels)

    def batches(epoch: int) -> list[list[int]]:
        return length_bucketed_batches(lengths, rng=random.Random(_epoch_seed(s.seed, epoch)),
                                       sort_chunk=s.sort_chunk, batch_size=s.batch_size)

    total = sum(len(batches(e)) for e in range(1, s.epochs + 1))
    warm = math.ceil(s.warmup_ratio * total)

    def lr_factor(n: int) -> float:  # linear up over `warm` steps, then down to 1/(total - warm + 1)
        return n / warm if n <= warm else (total - n + 1) / (total - warm + 1)

    def loss(m: Any, idx: list[int]) -> tuple[torch.Tensor, int, int]:
        logits = m(**collate([train[i] for i in idx])).logits  # [B, num_labels]
        return F.cross_entropy(logits, y[idx]), len(idx), len(idx)

    evaluate = None
    if has_eval:
        ev = encode(eval_texts, eval_text_pairs)
        ev_order = sorted(range(len(ev)), key=lambda i: len(ev[i]["input_ids"]))
        ev_y = torch.tensor(eval_labels)

        @torch.no_grad()
        def evaluate(m: Any) -> dict:
            m.eval()
            nll, correct = 0.0, 0
            for start in range(0, len(ev_order), s.eval_batch_size):
                idx = ev_order[start:start + s.eval_batch_size]
                logits = m(**collate([ev[i] for i in idx])).logits
                nll += F.cross_entropy(logits, ev_y[idx], reduction="sum").item()
                correct += (logits.argmax(-1) == ev_y[idx]).sum().item()
            return {"eval_loss": nll / len(ev), "eval_accuracy": correct / len(ev), "eval_n": len(ev)}

    info = {"task": "classifier", "n_train": len(texts), "n_eval": len(eval_texts) if has_eval else 0,
            "num_labels": n_labels, "label_names": label_names, "pairs": pairs is not None,
            "model": str(model_dir_or_model) if from_dir else type(model).__name__,
            "n_parameters": sum(p.numel() for p in model.parameters()), "total_steps": total,
            "settings": _settings_json(s), "data_sha256": fingerprint, "versions": _versions()}
    return _fit(_Job("classifier", model, tokenizer, s, out, info, resume, batches, loss, lr_factor, evaluate,
                     stop_after_epoch))


def _check_labels(name: str, labels: Any, n: int, num_labels: int | None) -> list[int]:
    if not isinstance(labels, (list, tuple)) or len(labels) != n:
        got = len(labels) if isinstance(labels, (list, tuple)) else type(labels).__name__
        raise DataError(f"{name} must be a list of {n} ints (one per text), got {got}")
    for i, v in enumerate(labels):
        if not _is_int(v) or v < 0 or (num_labels is not None and v >= num_labels):
            top = f"{num_labels - 1}" if num_labels is not None else "inf"
            raise DataError(f"{name}[{i}] must be an int in [0, {top}], got {v!r}")
    return [int(v) for v in labels]


# ---------------------------------------------------------------------------------- translation
def build_translation_model(settings: TranslationTrainSettings, tokenizer: Any) -> MarianMTModel:
    """A randomly initialised Marian model sized by `settings`, with the tokenizer's special ids.

    Embeddings are shared by encoder, decoder and output layer (joint vocabulary); decoding starts
    from `<s>` (the pad token when the tokenizer has no bos). Draw it after `torch.manual_seed`.
    """
    s, t = settings, tokenizer
    if t.pad_token_id is None or t.eos_token_id is None:
        raise ConfigError("tokenizer must have pad and eos tokens, got "
                          f"pad_token_id={t.pad_token_id!r}, eos_token_id={t.eos_token_id!r}")
    start = t.bos_token_id if t.bos_token_id is not None else t.pad_token_id
    cfg = MarianConfig(
        vocab_size=len(t), decoder_vocab_size=len(t), d_model=s.d_model,
        encoder_layers=s.encoder_layers, decoder_layers=s.decoder_layers,
        encoder_attention_heads=s.attention_heads, decoder_attention_heads=s.attention_heads,
        encoder_ffn_dim=s.ffn_dim, decoder_ffn_dim=s.ffn_dim, activation_function=s.activation,
        dropout=s.dropout, attention_dropout=s.attention_dropout, activation_dropout=s.activation_dropout,
        max_position_embeddings=max(512, 2 * s.max_length), scale_embedding=True,
        pad_token_id=t.pad_token_id, eos_token_id=t.eos_token_id, bos_token_id=start,
        decoder_start_token_id=start, forced_eos_token_id=t.eos_token_id,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )
    model = MarianMTModel(cfg)
    _freeze_positions(model)
    gc = model.generation_config  # what a plain generate() on a saved checkpoint does: greedy, bounded
    gc.num_beams, gc.do_sample, gc.max_new_tokens = 1, False, s.max_length
    return model


def _freeze_positions(model: Any) -> None:
    """Keep Marian's sinusoidal position tables fixed. `from_pretrained` (5.23) hands them back with
    requires_grad=True, and `save_pretrained` does not save them: trained, they would be lost."""
    for name, p in model.named_parameters():
        if name.endswith("embed_positions.weight"):
            p.requires_grad_(False)


def _encode_eos(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids + `</s>`, whatever the tokenizer's own post-processing does."""
    eos = tokenizer.eos_token_id
    return [ids + [eos] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def translate(model: Any, tokenizer: Any, sources: list[str], *, max_length: int = 128,
              batch_size: int = 64) -> list[str]:
    """Greedy translations of `sources` (truncated to `max_length` tokens), in the input order."""
    model.eval()
    ids = [x[:max_length - 1] + [tokenizer.eos_token_id] if len(x) > max_length else x
           for x in _encode_eos(tokenizer, sources)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    hyps: list[str] = [""] * len(ids)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            x = _pad([ids[i] for i in idx], tokenizer.pad_token_id)  # [B, S]
            gen = model.generate(input_ids=x, attention_mask=(x != tokenizer.pad_token_id).long(),
                                 max_new_tokens=max_length, num_beams=1, do_sample=False)
            for i, text in zip(idx, tokenizer.batch_decode(gen, skip_special_tokens=True), strict=True):
                hyps[i] = text.strip()
    return hyps


def train_translation(
    sources: list[str],
    targets: list[str],
    *,
    settings: TranslationTrainSettings,
    output_dir: str | Path,
    tokenizer: Any | None = None,
    eval_sources: list[str] | None = None,
    eval_targets: list[str] | None = None,
    stop_after_epoch: int | None = None,
) -> TrainResult:
    """Train a Marian encoder-decoder from scratch on (source, target) pairs; see the module doc.

    Without `tokenizer`, a joint tokenizer of `settings.vocab_size` is trained on sources + targets
    and saved to `output_dir/tokenizer` (a rerun that resumes uses the checkpoint's). Loss: label-smoothed cross-entropy per
    target token. With eval data, each epoch logs `eval_nll` (per token, no smoothing) and
    detokenised sacreBLEU of greedy translations (`eval_bleu`, `bleu_signature`).
    """
    s = settings
    if not isinstance(s, TranslationTrainSettings):
        raise ConfigError(f"settings must be a TranslationTrainSettings, got {type(s).__name__}")
    _check_stop(stop_after_epoch)
    sources = _check_texts("sources", sources)
    targets = _check_texts("targets", targets, len(sources))
    if not sources:
        raise DataError("sources must hold at least one pair, got 0")
    has_eval = eval_sources is not None or eval_targets is not None
    if has_eval:
        if eval_sources is None or eval_targets is None:
            raise DataError("eval_sources and eval_targets must be given together")
        eval_sources = _check_texts("eval_sources", eval_sources)
        eval_targets = _check_texts("eval_targets", eval_targets, len(eval_sources))
        if not eval_sources:
            raise DataError("eval_sources must hold at least one pair, got 0")

    out = _prepare_dir(output_dir)
    fingerprint = _fingerprint(sources, targets)
    resume = _find_resume(out, "translation", s, fingerprint)
    if tokenizer is None and resume is not None:  # the one the checkpoint was trained with
        tokenizer = AutoTokenizer.from_pretrained(str(out / f"epoch-{resume[0]}"))
    elif tokenizer is None:
        tokenizer = train_tokenizer(sources + targets, s.vocab_size, out / "tokenizer", kind=s.tokenizer_kind)
    src_ids, tgt_ids = _encode_eos(tokenizer, sources), _encode_eos(tokenizer, targets)
    keep = [i for i in range(len(sources)) if max(len(src_ids[i]), len(tgt_ids[i])) <= s.max_length]
    if not keep:
        raise DataError(f"every training pair is longer than settings.max_length={s.max_length} tokens")
    src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
    pad = tokenizer.pad_token_id

    torch.manual_seed(s.seed)
    if resume is not None:
        model = MarianMTModel.from_pretrained(str(out / f"epoch-{resume[0]}"))
        _freeze_positions(model)
    else:
        model = build_translation_model(s, tokenizer)
    start = model.config.decoder_start_token_id

    def collate(src: list[list[int]], tgt: list[list[int]]) -> dict[str, torch.Tensor]:
        x = _pad(src, pad)  # [B, S]
        return {"input_ids": x, "attention_mask": (x != pad).long(),
                "decoder_input_ids": _pad([[start] + t[:-1] for t in tgt], pad),  # [B, T], teacher forcing
                "labels": _pad(tgt, IGNORE)}  # [B, T]

    def forward_loss(m: Any, batch: dict[str, torch.Tensor], smoothing: float) -> tuple[torch.Tensor, int]:
        labels = batch.pop("labels")
        logits = m(**batch).logits  # [B, T, V]
        total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE,
                                label_smoothing=smoothing, reduction="sum")
        n_tokens = int((labels != IGNORE).sum())
        return total / n_tokens, n_tokens

    lengths = [max(len(a), len(b)) for a, b in zip(src_ids, tgt_ids, strict=True)]

    def batches(epoch: int) -> list[list[int]]:
        return length_bucketed_batches(lengths, rng=random.Random(_epoch_seed(s.seed, epoch)),
                                       sort_chunk=s.sort_chunk, batch_size=s.batch_size, max_tokens=s.max_tokens)

    def lr_factor(n: int) -> float:  # linear warm-up, then inverse square root
        return n / s.warmup_steps if n <= s.warmup_steps else math.sqrt(s.warmup_steps / n)

    def loss(m: Any, idx: list[int]) -> tuple[torch.Tensor, int, int]:
        mean, n_tokens = forward_loss(m, collate([src_ids[i] for i in idx], [tgt_ids[i] for i in idx]),
                                      s.label_smoothing)
        return mean, n_tokens, len(idx)

    evaluate = None
    if has_eval:
        import sacrebleu

        ev_src = [x[:s.max_length - 1] + [tokenizer.eos_token_id] if len(x) > s.max_length else x
                  for x in _encode_eos(tokenizer, eval_sources)]
        ev_tgt = [x[:s.max_length] for x in _encode_eos(tokenizer, eval_targets)]

        @torch.no_grad()
        def evaluate(m: Any) -> dict:
            m.eval()
            nll, n_tok = 0.0, 0
            for st in range(0, len(ev_src), s.eval_batch_size):
                sl = slice(st, st + s.eval_batch_size)
                mean, n = forward_loss(m, collate(ev_src[sl], ev_tgt[sl]), 0.0)
                nll, n_tok = nll + mean.item() * n, n_tok + n
            hyps = translate(m, tokenizer, eval_sources, max_length=s.max_length,
                             batch_size=s.eval_batch_size)
            bleu = sacrebleu.metrics.BLEU()
            score = bleu.corpus_score(hyps, [eval_targets])
            return {"eval_nll": nll / n_tok, "eval_bleu": round(score.score, 2),
                    "bleu_signature": str(bleu.get_signature()), "eval_n": len(eval_sources)}

    info = {"task": "translation", "architecture": "MarianMTModel", "n_pairs": len(sources),
            "n_train": len(keep), "n_skipped_too_long": len(sources) - len(keep),
            "n_eval": len(eval_sources) if has_eval else 0, "vocab_size": len(tokenizer),
            "n_parameters": sum(p.numel() for p in model.parameters()), "settings": _settings_json(s),
            "data_sha256": fingerprint, "versions": _versions()}
    return _fit(_Job("translation", model, tokenizer, s, out, info, resume, batches, loss, lr_factor,
                     evaluate, stop_after_epoch))
