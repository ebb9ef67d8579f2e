"""Loading for users: a model directory (or GGUF file) in, a model that runs exactly out.

:func:`load_pruned` reads a directory through :func:`.saving.read_pruned` (transformers' own
``from_pretrained`` with the kept heads replayed) and then checks a pruned model like one about to be
pruned (:mod:`.verify`: its family may not be exact under this environment's transformers).
:func:`save_pruned` (:mod:`.saving`) writes what these read. Models and tokenizers come from local
directories only, never from a hub, and never with custom code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from torch import nn

from ..errors import ConfigError, DataError, HeadpruneError, UnsupportedModelError
from .model.records import KEPT_KEY, KEPT_NEURONS_KEY, config_record
from .safety.verify import check_model, give_removed_sites_calls
from .store.checkpoint import check_output_dir, read_config
from .store.gguf import is_gguf, load_gguf, load_gguf_tokenizer
from .store.quiet import transformers_bars_off
from .store.saving import read_pruned, save_pruned

__all__ = ["save_pruned", "load_pruned", "load_model", "load_tokenizer", "check_output_dir"]


@transformers_bars_off()
def load_pruned(path: str | Path, *, model_class: type | None = None, dtype: torch.dtype | str | None = None,
                device: torch.device | str | None = None, attn_implementation: str | None = None,
                verify: bool = True, device_map: str | dict | None = None, new_head: bool = False) -> nn.Module:
    """Load a model written by :func:`save_pruned` (or any local Hugging Face directory), in eval mode.

    ``model_class`` defaults to the config's first architecture (e.g. ``BertForSequenceClassification``);
    ``dtype`` and ``attn_implementation`` default to what the model was saved with; ``device``
    (default CPU) is where the model ends up; ``device_map`` (e.g. ``"auto"``, needs ``accelerate``) spreads
    it over several devices instead, as transformers does (give one of the two). A pruned directory is built from its config, its kept
    heads are replayed, and transformers' ``from_pretrained`` loads the weights into it; anything
    that does not fit raises a typed error naming the directory. Unpruned directories go through
    plain ``from_pretrained`` with these arguments. Custom code (``auto_map``) and quantized models
    are refused. A pruned model is then checked like one about to be pruned (:mod:`.verify`: the
    family may not be exact under this environment's transformers); ``verify=False`` skips that.
    Weights that leave any parameter newly initialised (missing from the checkpoint, or of another shape:
    e.g. a config over another model's weights, a classifier without its head) are refused with a typed
    error naming the keys (:mod:`.loading`); ``new_head=True`` allows a fresh head outside the base model
    (to fine-tune a headless encoder), and evaluation then refuses to report its accuracy.
    """
    model = read_pruned(path, model_class=model_class, dtype=dtype, device=device,
                        attn_implementation=attn_implementation, device_map=device_map, new_head=new_head)
    give_removed_sites_calls(model)  # from its config.json; computed from the model for older directories
    if verify and config_record(model.config, KEPT_KEY):
        units = ("heads", "neurons") if config_record(model.config, KEPT_NEURONS_KEY) else ("heads",)
        verdict = check_model(model, units)
        if not verdict.ok:
            raise UnsupportedModelError(f"{str(path)!r} holds a pruned model that headprune cannot run exactly "
                                        f"with transformers {transformers.__version__}: {verdict.error()}")
    return model


def load_model(model_dir: str | Path, *, model_class: type | None = None, device: torch.device | str | None = None,
               dtype: torch.dtype | str | None = None, device_map: str | dict | None = None,
               new_head: bool = False) -> nn.Module:
    """A model from a local directory: pruned ones get their kept heads replayed; eval mode; the saved dtype
    unless ``dtype``; on ``device`` (default CPU) or spread by ``device_map``; weights that leave a parameter
    newly initialised refused unless ``new_head`` allows a fresh head (see :func:`load_pruned`).
    A path ending in ``.gguf`` is a GGUF file, loaded through transformers' GGUF reader (:mod:`.gguf`)."""
    if is_gguf(model_dir):
        if device_map is not None:
            raise ConfigError(f"device_map={device_map!r} with a GGUF file; allowed: device= (one device)")
        model = load_gguf(model_dir, **({"dtype": getattr(torch, dtype) if isinstance(dtype, str) else dtype}
                                        if dtype is not None else {}))
        return model.to(device) if device is not None else model
    path = Path(model_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"model directory {str(path)!r} is a file, not a directory; expected a local Hugging "
                          "Face model directory (config.json + weights) or a .gguf file")
    if not path.is_dir():
        raise ConfigError(f"model directory {str(path)!r} does not exist; expected a local Hugging Face model "
                          "directory (config.json + weights)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model directory {str(path)!r} has no config.json")
    return load_pruned(path, model_class=model_class, device=device, dtype=dtype, device_map=device_map,
                       new_head=new_head).eval()


def load_tokenizer(model_dir: str | Path):
    """The directory's tokenizer, or None when it has none. Never runs code from the directory.
    A ``.gguf`` file: the tokenizer in its metadata."""
    from transformers import AutoTokenizer

    if is_gguf(model_dir):
        return load_gguf_tokenizer(model_dir)
    path = Path(model_dir)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model")):
        return None
    if (path / "config.json").is_file():
        read_config(path)  # AutoTokenizer reads it too: its faults are named as the config's, not the tokenizer's
    settings = path / "tokenizer_config.json"
    if settings.is_file():
        try:
            custom = json.loads(settings.read_text(encoding="utf-8")).get("auto_map")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            custom = None  # AutoTokenizer gives its own error
        if custom:
            raise UnsupportedModelError(f"tokenizer in {str(path)!r} needs custom code (tokenizer_config.json "
                                        "auto_map); headprune never runs code from a model directory")
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except HeadpruneError:
        raise
    except Exception as e:  # noqa: BLE001  # a tokenizer file that transformers or tokenizers cannot read
        first = (str(e).strip().splitlines() or [""])[0]
        raise DataError(f"tokenizer in {str(path)!r} cannot be loaded ({type(e).__name__}: {first}); "
                        "save a working tokenizer beside the model (tokenizer.save_pretrained(dir))") from None
