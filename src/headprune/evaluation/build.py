"""An evaluator from a task name and data paths: what ``headprune evaluate`` and the study commands build."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from ..checks import check_int
from ..errors import ConfigError
from .classification import Classification
from .data import check_limit, load_classification, load_parallel, load_text, python_docs_text
from .lm import LanguageModelling
from .translation import Translation

TASKS = ("classification", "translation", "lm")
CAUSAL = ("ForCausalLM", "LMHeadModel")  # class-name suffixes of causal language models
CLASSIFIER = "ForSequenceClassification"
HEADS = ("classifier", "score", "classification_head")  # where other classes keep a classifier
PYDOC = "builtin:pydoc"  # data value for the English prose shipped with CPython (pydoc_data)
COLUMNS = ("text_column", "text_pair_column", "label_column", "source_column", "target_column")


@dataclass(frozen=True)
class TaskData:
    """The examples an evaluator reads: ``data`` (a file, a datasets directory, or ``builtin:pydoc`` for lm),
    ``data2`` the target file of translation, ``columns`` {text_column, text_pair_column, label_column,
    source_column, target_column: a name or a position}, ``limit`` the first N examples (lm: blocks),
    ``split`` one split of a datasets directory, ``label_map`` {label: id} (classification): the data's
    labels as the model's ids."""

    data: str
    data2: Path | None = None
    columns: dict | None = None
    limit: int | None = None
    split: str | None = None
    label_map: dict | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.data, (str, PathLike)) or not str(self.data):
            raise ConfigError(f"data={self.data!r}; allowed: a file or directory path, or {PYDOC!r}")
        for name in ("columns", "label_map"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{name}={getattr(self, name)!r}; allowed: a dict or None")
        check_limit(self.limit)


@dataclass(frozen=True)
class EvalOptions:
    """How an evaluator runs (None: the task's default): ``batch_size``, ``metric`` (classification),
    ``max_length`` (classification inputs, translation sources), ``beams`` and ``max_new_tokens``
    (translation), ``block_size`` and ``prefix`` (lm: every block starts with the model's prefix token,
    BOS else EOS, as lm-evaluation-harness measures it)."""

    batch_size: int | None = None
    metric: str | None = None
    max_length: int | None = None
    beams: int = 1
    max_new_tokens: int | None = None
    block_size: int = 128
    prefix: bool = True

    def __post_init__(self) -> None:  # 0 is refused, never read as "the default"; max_length by build_task
        check_int("batch_size", self.batch_size, 1, optional=True)  # (its minimum depends on the task)
        check_int("num_beams", self.beams, 1)
        check_int("max_new_tokens", self.max_new_tokens, 1, optional=True)
        check_int("block_size", self.block_size, 2)


def build_task(task: str, tokenizer, config, data: TaskData, options: EvalOptions | None = None):
    """The evaluator of ``task`` on ``data`` with ``options`` (default ``EvalOptions()``); all checks raise
    HeadpruneError, and data settings or options that do not apply to the task are refused by name."""
    check_task(task)
    if not isinstance(data, TaskData):
        raise ConfigError(f"data: expected a TaskData, got {type(data).__name__}")
    o = EvalOptions() if options is None else options
    if not isinstance(o, EvalOptions):
        raise ConfigError(f"options: expected an EvalOptions, got {type(o).__name__}")
    if task != "lm" and o.prefix is not True:
        raise ConfigError(f"prefix={o.prefix!r} (--no-prefix-token) applies to --task lm only, not --task {task}")
    columns = {k: (data.columns or {}).get(k) for k in COLUMNS}
    text_cols = {k: columns[k] for k in ("text_column", "text_pair_column", "label_column")}
    pair_cols = {k: columns[k] for k in ("source_column", "target_column")}
    if task == "classification":
        _refuse(task, data2=data.data2, **pair_cols, max_new_tokens=o.max_new_tokens)
        _check_lengths(config, task, o)
        rows = load_classification(data.data, **text_cols, limit=data.limit, split=data.split)
        return _signed(Classification(tokenizer, rows, config=config, label2id=data.label_map,
                                      metric=o.metric or "accuracy", max_length=_given(o.max_length, 128),
                                      batch_size=_given(o.batch_size, 32)),
                       split=data.split, label_map=data.label_map)
    if task == "translation":
        _refuse(task, **text_cols, metric=o.metric, label_map=data.label_map)
        _check_lengths(config, task, o)
        pairs = load_parallel(data.data, data.data2, **pair_cols, limit=data.limit, split=data.split)
        return _signed(Translation(tokenizer, pairs, batch_size=_given(o.batch_size, 32), num_beams=o.beams,
                                   max_new_tokens=o.max_new_tokens, max_source_length=_given(o.max_length, 256)),
                       split=data.split)
    _refuse(task, data2=data.data2, **text_cols, **pair_cols, metric=o.metric, split=data.split,
            label_map=data.label_map, max_new_tokens=o.max_new_tokens)
    _check_lengths(config, task, o)
    texts = python_docs_text() if data.data == PYDOC else load_text(data.data)
    return LanguageModelling(tokenizer, texts, block_size=o.block_size, batch_size=_given(o.batch_size, 8),
                             max_blocks=data.limit, prefix=o.prefix)


def _given(value, default):
    """``value`` unless it was left out (None): a 0 given is refused by the checks, never replaced."""
    return default if value is None else value


def _check_lengths(config, task: str, options: EvalOptions) -> None:
    """A classification input holds at least 2 tokens, and a length fits the model's position table:
    ``max_length`` (classification, translation sources) or ``block_size`` (lm) beyond
    :func:`position_limit` would index past it."""
    check_int("max_length", options.max_length, 2 if task == "classification" else 1, optional=True)
    positions = position_limit(config)
    name = "block_size" if task == "lm" else "max_length"
    length = getattr(options, name)
    lo = 2 if task != "translation" else 1
    if positions is not None and length is not None and length > positions:
        raise ConfigError(f"{name}={length}; allowed: an integer {lo}..{positions} (the model has {positions} "
                          f"positions: max_position_embeddings={_trained_positions(config)})")
    trained = _trained_positions(config)
    if positions is None and task == "lm" and trained is not None and length > trained:  # rotary: runs, untrained
        raise ConfigError(f"{name}={length}; allowed: an integer {lo}..{trained} (the model's "
                          f"max_position_embeddings={trained}: it was not trained on longer sequences)")


def _trained_positions(config) -> int | None:
    """``max_position_embeddings`` (or GPT-2's ``n_positions``) as the config states it, when it does."""
    value = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


ROBERTA_LIKE = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text", "xmod",
                "roberta-prelayernorm", "mpnet", "ernie_m")  # position ids start after the padding index


def position_limit(config) -> int | None:
    """The longest input the model's absolute position table holds (None: no such table, e.g. T5's
    relative positions or rotary ones, which run past ``max_position_embeddings`` without an error).
    RoBERTa-like tables start after the padding index, so hold ``pad_token_id + 1`` fewer."""
    if config is None or getattr(config, "rope_parameters", None) is not None or \
            getattr(config, "rope_theta", None) is not None:
        return None
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not isinstance(positions, int) or isinstance(positions, bool):
        return None
    if getattr(config, "relative_attention_num_buckets", None) is not None and \
            getattr(config, "max_position_embeddings", None) is None:
        return None  # T5-like: relative position buckets, no table to run past
    if getattr(config, "model_type", None) in ROBERTA_LIKE:
        positions -= int(getattr(config, "pad_token_id", None) or 0) + 1
    return positions


def _signed(evaluator, **given):
    """The evaluator, its signature holding the data settings that were given (split, label map)."""
    evaluator.signature.update({k: v for k, v in given.items() if v is not None})
    return evaluator


def check_task(task: str) -> None:
    if task not in TASKS:
        raise ConfigError(f"--task {task!r}; allowed: {', '.join(TASKS)}")


def check_model(task: str, model, source: str = "the model", *, config=None) -> None:
    """Refuse, in one line naming the model's class and what to do, a model without the head ``task``
    needs: classification a sequence classifier, translation an encoder-decoder with ``generate``, lm a
    causal LM. ``model`` is a model, or a model class with its ``config``; call it before reading data."""
    check_task(task)
    cls = model if isinstance(model, type) else type(model)
    name = cls.__name__
    config = config if config is not None else getattr(model, "config", None)
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    causal = name.endswith(CAUSAL)
    if task == "classification":
        if name.endswith(CLASSIFIER) or (not (enc_dec or causal) and _has_classifier(model, config)):
            return
        need = "a sequence classifier (a ...ForSequenceClassification)"
    elif task == "translation":
        if enc_dec and not name.endswith(CLASSIFIER) and callable(getattr(cls, "generate", None)):
            return
        need = "an encoder-decoder that generates (e.g. MarianMTModel, a ...ForConditionalGeneration)"
    else:
        if causal:
            return
        need = "a causal language model (a ...ForCausalLM or ...LMHeadModel)"
    raise ConfigError(f"--task {task} needs {need}; {source!r} holds a {name} ({_what(name, enc_dec, causal)}); "
                      + _advice(task, name, enc_dec, causal, source))


def _has_classifier(model, config) -> bool:
    """An instance whose classifier module ends in a Linear with ``config.num_labels`` outputs."""
    import torch.nn as nn

    if isinstance(model, type) or not getattr(config, "num_labels", None):
        return False
    for attr in HEADS:
        linears = [m for m in getattr(getattr(model, attr, None), "modules", list)() if isinstance(m, nn.Linear)]
        if linears and linears[-1].out_features == config.num_labels:
            return True
    return False


def _what(name: str, enc_dec: bool, causal: bool) -> str:
    if causal:
        return "a causal language model"
    if name.endswith(CLASSIFIER):
        return "a sequence classifier"
    if enc_dec:
        return "an encoder-decoder"
    if name.endswith("ForMaskedLM"):
        return "a masked language model without a classification head"
    if "For" not in name:
        return "a pretrained base model without a task head"
    return "a model without a sequence-classification head"


def _advice(task: str, name: str, enc_dec: bool, causal: bool, source: str) -> str:
    """What to do instead: the task this model does fit, and how to make a model that fits ``task``."""
    fits = ("lm" if causal else "classification" if name.endswith(CLASSIFIER) else "translation" if enc_dec
            else None)
    other = f"it fits --task {fits}" if fits and fits != task else ""
    make = {"classification": "fine-tune a classification head on it first: headprune train classifier "
                              f"{shlex.quote(source)} --data TRAIN.tsv -o OUT, then use OUT/final",
            "translation": "train one: headprune train translation --data SRC --data2 TGT -o OUT",
            "lm": "use a causal LM checkpoint (e.g. GPT-2, Llama, Qwen2)"}[task]
    if other and task == "classification":
        make = "a classifier: fine-tune a pretrained encoder with headprune train classifier"
    return f"{other}; for this task, {make}" if other else make


def _refuse(task: str, **given: object) -> None:
    for flag, value in given.items():
        if value is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} does not apply to --task {task}")
