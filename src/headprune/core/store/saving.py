"""Save and load models, unverified: safetensors weights + the config, which carries the kept heads.

:func:`save_pruned` writes a Hugging Face model directory atomically (into a temporary sibling,
renamed into place at the end). A pruned model's directory has the layout described in
:mod:`.checkpoint`: the kept heads in ``config.json``, weights under a name plain transformers does
not read, and a marker that makes ``from_pretrained`` fail loudly, naming
:func:`headprune.load_pruned`. :func:`read_pruned` loads it through transformers' own
``from_pretrained`` with the kept heads replayed on the freshly built model, so key conversions,
tied weights, dtype and attention implementation are transformers'. No pickle anywhere; models
come from local directories only, never from a hub, and never with custom code. Loading with the
check that the pruned family is exact in this environment is :func:`headprune.load_pruned` (:mod:`.io`,
above the verification this layer sits below).
"""

from __future__ import annotations

import copy
import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers.utils import logging as hf_logging

from ...errors import ConfigError, HeadpruneError, PlanError
from ...provenance import __version__
from ..model.calls import template_from_record
from ..model.records import CALLS_KEY, KEPT_KEY, LAYOUT_KEY, VERSION_KEY, config_record
from ..model.runtime import give_calls
from .checkpoint import (
    atomic_directory,
    check_output_dir,
    finish_layout,
    from_pretrained_pruned,
    hf_config,
    pruned_record,
    read_config,
    weight_files,
)
from .loading import check_load_report, load_failure
from .quiet import transformers_bars_off
from .stock import write_stock

log = logging.getLogger("headprune")


@transformers_bars_off()
def save_pruned(model: nn.Module, path: str | Path, tokenizer=None, *, stock: bool = True) -> Path:
    """Write ``model`` (pruned or not) and optionally its tokenizer to the new directory ``path``.

    ``path`` must not exist or be an empty directory. The directory appears only once complete: a
    failure half way (a full disk) leaves nothing behind, and saving never changes ``model``. An
    unpruned model is saved exactly as ``save_pretrained`` does. A pruned one whose shape a stock
    config can say (the same heads in every layer of a family with ``head_dim`` in its config,
    :mod:`.stock`) is saved as a stock directory that plain ``from_pretrained`` loads exactly (checked
    by reloading it before the directory appears). When a stock directory cannot be written or does
    not reload exactly, for any reason (or with ``stock=False``), the model is saved in headprune's
    layout instead (load it with :func:`load_pruned`; plain ``from_pretrained`` refuses it), the reason
    is logged in one line and recorded in ``config.json`` (:data:`.records.LAYOUT_KEY`). The attention
    implementation is recorded in ``config.json`` so loading keeps it. A failure other than the
    machine's (``OSError``) or a typed one is raised as :class:`~headprune.errors.HeadpruneError`.
    """
    path = check_output_dir(path)
    pruned = bool(config_record(model.config, KEPT_KEY))
    try:
        with _config_for_saving(model), atomic_directory(path) as tmp:
            reason, tried = write_stock(model, tmp) if pruned and stock else ("stock=False" if pruned else None, False)
            if reason is not None or not pruned:
                model.save_pretrained(tmp)
                finish_layout(tmp, model, pruned)
            if reason is not None:
                _record_reason(tmp, reason, tried)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
    except (HeadpruneError, OSError):
        raise
    except Exception as e:  # transformers or safetensors refusing what it was given: typed, nothing written
        raise HeadpruneError(f"save_pruned could not write {str(path)!r} ({type(e).__name__}: "
                             f"{_first_line(e)}); nothing was written and the model is unchanged") from e
    return path


@contextmanager
def _config_for_saving(model: nn.Module):
    """While it is written, ``model`` carries a copy of its config with the saving headprune's version
    (``save_pretrained`` also fills ``architectures`` ...): the model's own config stays as it was."""
    config = model.config
    model.config = copy.deepcopy(config)
    setattr(model.config, VERSION_KEY, __version__)
    try:
        yield
    finally:
        model.config = config


def _record_reason(directory: Path, reason: str, tried: bool) -> None:
    """Say why a pruned model was saved in headprune's layout: a field of config.json and one log line (a
    warning when a stock form was tried and failed, else for information: e.g. a BERT's head size)."""
    file = directory / "config.json"
    raw = json.loads(file.read_text(encoding="utf-8"))
    raw[LAYOUT_KEY] = reason
    file.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (log.warning if tried else log.info)("saved in headprune's layout (load with headprune.load_pruned), not as a stock directory: %s", reason)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def read_pruned(path: str | Path, *, model_class: type | None = None, dtype: torch.dtype | str | None = None,
                device: torch.device | str | None = None, attn_implementation: str | None = None,
                device_map: str | dict | None = None, new_head: bool = False) -> nn.Module:
    """Load a model written by :func:`save_pruned` (or any local Hugging Face directory), in eval mode,
    without checking that its pruned family runs exactly here (:func:`headprune.load_pruned` checks).
    Weights that leave a parameter newly initialised are refused (:mod:`.loading`), except, with
    ``new_head``, a fresh head outside the base model of an unpruned directory.

    ``model_class`` defaults to the config's first architecture (e.g. ``BertForSequenceClassification``);
    ``dtype`` and ``attn_implementation`` default to what the model was saved with; ``device``
    (default CPU) is where the model ends up; ``device_map`` (e.g. ``"auto"``, needs ``accelerate``) spreads
    it over several devices instead, as transformers does (give one of the two). A pruned directory is built from its config, its kept
    heads are replayed, and transformers' ``from_pretrained`` loads the weights into it; anything
    that does not fit raises a typed error naming the directory. Unpruned directories go through
    plain ``from_pretrained`` with these arguments. Custom code (``auto_map``) and quantized models
    are refused.
    """
    path = Path(path)
    kept, original = pruned_record(read_config(path), path)
    config = hf_config(path)
    cls = model_class or _architecture(config, path)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise ConfigError(f"model_class={cls!r}; allowed: a transformers PreTrainedModel class")
    kwargs: dict = {"trust_remote_code": False, "local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if device_map is not None:
        if device is not None:
            raise ConfigError(f"device={device!r} and device_map={device_map!r}; allowed: one of them")
        kwargs["device_map"] = device_map
    weights = weight_files(path, required=bool(kept))
    if kept and weights is not None:  # required=True: a pruned directory without weights was refused
        model = from_pretrained_pruned(cls, path, config, kept, original, weights, strict=model_class is None,
                                       **kwargs)
    else:
        model = _plain(cls, path, config, new_head=new_head, **kwargs)
    if hasattr(model.config, LAYOUT_KEY):  # said why it was saved so; not part of the model
        delattr(model.config, LAYOUT_KEY)
    record = config_record(model.config, CALLS_KEY) or {}
    give_calls(model, {name: t for name, r in record.items() if (t := template_from_record(r)) is not None})
    if device is not None:
        model.to(device)
    return model.eval()


def _plain(cls: Any, path: Path, config, *, new_head: bool, **kwargs) -> nn.Module:
    """``cls.from_pretrained`` of an unpruned directory, held to its load report (:mod:`.loading`); what
    transformers raises on a bad directory is one typed line. transformers' own report is not printed:
    a misfit is refused instead."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        # a tensor of another shape is reported (mismatched_keys) and refused below, naming it and both shapes
        model, info = cls.from_pretrained(path, config=config, output_loading_info=True, ignore_mismatched_sizes=True,
                                          **kwargs)
    except HeadpruneError:
        raise
    except Exception as e:  # noqa: BLE001  # transformers, torch or safetensors refusing the directory
        raise load_failure(e, path) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return check_load_report(model, info, path, new_head=new_head)


def _architecture(config, path: Path) -> type:
    names = getattr(config, "architectures", None) or []
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise PlanError(f"config in {str(path)!r} names no known architecture ({names}); pass model_class=")
