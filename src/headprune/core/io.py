"""Save and load models: safetensors weights + the config, which carries the kept heads.

A pruned model is saved like any Hugging Face model (``config.json`` with ``headprune_kept_heads``
and ``headprune_original_heads``, ``model.safetensors``). Loading builds the model from its config,
replays the kept heads on it (so the smaller shapes exist) and then loads the weights. No pickle
anywhere. Models and tokenizers come from local directories only, never from a hub.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from ..errors import ConfigError, PlanError
from ..provenance import __version__
from .surgery import KEPT_KEY, LEGACY_KEYS, ORIGINAL_KEY, config_record, keep_heads

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def save_pruned(model: nn.Module, path: str | Path, tokenizer=None) -> Path:
    """Write ``model`` (pruned or not) and optionally its tokenizer to directory ``path``."""
    path = Path(path)
    model.config.headprune_version = __version__
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def load_pruned(path: str | Path, *, model_class: type | None = None, dtype: torch.dtype | None = None) -> nn.Module:
    """Load a model written by :func:`save_pruned` (or any HF directory): shapes rebuilt, weights loaded.

    ``model_class`` defaults to the config's first architecture (e.g. ``BertForSequenceClassification``).
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise PlanError(f"path {str(path)!r} has no config.json; expected a directory written by save_pruned")
    config = transformers.AutoConfig.from_pretrained(path)
    cls = model_class or _architecture(config, path)
    kept = config_record(config, KEPT_KEY)
    original = config_record(config, ORIGINAL_KEY)
    if not kept:
        return cls.from_pretrained(path, dtype=dtype) if dtype else cls.from_pretrained(path)
    for key in (KEPT_KEY, ORIGINAL_KEY, *LEGACY_KEYS.values()):
        if hasattr(config, key):
            delattr(config, key)
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = cls._from_config(config)
    keep_heads(model, kept, original)
    state = _read_weights(path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    unsaved = [k for k in missing if k in set(getattr(model, "_keys_to_ignore_on_save", None) or ())]
    missing = [k for k in missing if k not in tied and k not in unsaved]
    if missing or unexpected:
        raise PlanError(f"weights in {str(path)!r} do not fit the kept heads: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for key in unsaved:  # never saved by design (e.g. Marian's sinusoidal positions): rebuilt as at construction
        model._init_weights(model.get_submodule(key.rsplit(".", 1)[0]))
    model.tie_weights()
    model.to(dtype or next(iter(state.values())).dtype)
    model.eval()
    return model


def _architecture(config, path: Path) -> type:
    names = getattr(config, "architectures", None) or []
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise PlanError(f"config in {str(path)!r} names no known architecture ({names}); pass model_class=")


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if (path / WEIGHTS).is_file():
        return load_file(path / WEIGHTS)
    if (path / INDEX).is_file():
        files = sorted(set(json.loads((path / INDEX).read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(path / name))
        return state
    raise PlanError(f"no {WEIGHTS} or {INDEX} in {str(path)!r}")


def load_model(model_dir: str | Path, *, model_class: type | None = None) -> nn.Module:
    """A model from a local directory: pruned ones get their kept heads replayed; eval mode, float32."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ConfigError(f"model directory {str(path)!r} does not exist; expected a local Hugging Face model "
                          "directory (config.json + weights)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model directory {str(path)!r} has no config.json")
    from transformers.utils import logging

    logging.disable_progress_bar()  # one model directory: a bar per weight file is noise
    return load_pruned(path, model_class=model_class).eval()


def load_tokenizer(model_dir: str | Path):
    """The directory's tokenizer, or None when it has none."""
    from transformers import AutoTokenizer

    path = Path(model_dir)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model")):
        return None
    return AutoTokenizer.from_pretrained(path)
