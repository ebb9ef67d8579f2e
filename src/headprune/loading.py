"""Load models and tokenizers from local directories only (never from a hub)."""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from .errors import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def load_model(model_dir: str | Path, *, model_class: type | None = None) -> nn.Module:
    """A model from a local directory: pruned ones get their plan replayed; eval mode, float32."""
    from .io import load_pruned

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
