"""A saved model on disk: the directory layout, its checks, the atomic write, and the one place that
makes transformers load a pruned model.

Layout of a **pruned** directory (written by :func:`headprune.save_pruned`)::

    config.json                    the model's config + headprune_kept_heads / headprune_original_heads,
                                   attn_implementation, and transformers_weights = MARKER (see below)
    pruned.safetensors             the weights, as save_pretrained writes them (or pruned.safetensors.index.json
                                   + model-0000i-of-0000n.safetensors shards)
    HEADPRUNE.md                   a note: what this is and how to load it
    generation_config.json, tokenizer files ...

Plain ``transformers.AutoModel*.from_pretrained`` must never load it with random attention weights
(it would build the unpruned shapes). Two guards make it fail loudly: ``transformers_weights`` in
config.json (the field transformers reads for a non-standard weights file name) holds a sentence that
is not a file name, so transformers 5 raises ``ValueError`` quoting it (it names
``headprune.load_pruned``); and the weights are not in ``model.safetensors``, so a transformers that
ignores that field raises ``OSError`` (no model.safetensors). An unpruned model is saved as
``save_pretrained`` writes it (config.json also records ``attn_implementation``, which transformers reads).

Directories written before this layout (``headprune_plan`` / ``headprune_heads`` or the current keys,
weights in ``model.safetensors``) still load.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers.utils import logging as hf_logging

from ...errors import ConfigError, DataError, PlanError, UnsupportedModelError
from ..cut.biases import add_zero_biases, added_biases
from ..cut.neurons import cut_neurons, neurons_to_drop
from ..cut.surgery import cut_heads, heads_to_drop
from ..model.records import KEPT_KEY, KEPT_NEURONS_KEY, LEGACY_KEYS, ORIGINAL_KEY, ORIGINAL_NEURONS_KEY
from .loading import tied_keys

PLAIN_WEIGHTS, PLAIN_INDEX = "model.safetensors", "model.safetensors.index.json"  # what transformers looks for
PRUNED_WEIGHTS, PRUNED_INDEX = "pruned.safetensors", "pruned.safetensors.index.json"  # what it does not
WEIGHT_NAMES = (PRUNED_WEIGHTS, PRUNED_INDEX, PLAIN_WEIGHTS, PLAIN_INDEX)  # looked for in this order
NOTE = "HEADPRUNE.md"
MARKER_KEY = "transformers_weights"
MARKER = ("pruned by headprune (attention heads removed, shapes differ per layer): load this directory with "
          f"headprune.load_pruned(path), not from_pretrained; see {NOTE}")
ATTN_KEY = "attn_implementation"  # read back by PreTrainedConfig (and so by plain from_pretrained too)

NOTE_TEXT = f"""# A model pruned by headprune

Some attention heads of this model were physically removed, so its layers no longer have the shapes
its config describes. `config.json` records, per attention site, the original indices of the heads
each site keeps (`{KEPT_KEY}`) and how many it had (`{ORIGINAL_KEY}`).

Load it with

    import headprune
    model = headprune.load_pruned("path/to/this/directory")

`transformers.AutoModel*.from_pretrained` refuses this directory on purpose (its weights are in
`{PRUNED_WEIGHTS}`, and `config.json` names no weights file it can read): it would otherwise build the
unpruned shapes and silently fill the attention of any layer that lost all its heads with random
weights.
"""


# ---------------------------------------------------------------- reading and checking a directory

def read_config(path: Path) -> dict:
    """``path/config.json`` as a dict, refused (typed error naming the directory) when headprune cannot
    load it safely: unreadable, custom code, quantized, or a model type transformers does not know."""
    file = path / "config.json"
    if not file.is_file():
        raise PlanError(f"path {str(path)!r} has no config.json; expected a directory written by save_pruned "
                        "or a Hugging Face model directory")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"config.json in {str(path)!r} cannot be read as JSON ({e})") from None
    if not isinstance(raw, dict):
        raise DataError(f"config.json in {str(path)!r} holds a {type(raw).__name__}, expected a JSON object")
    if raw.get("auto_map"):
        raise UnsupportedModelError(f"model directory {str(path)!r} needs custom code (config.json auto_map: "
                                    f"{sorted(raw['auto_map'])}); headprune never runs code from a model "
                                    "directory (trust_remote_code=False)")
    quant = raw.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise UnsupportedModelError(f"model directory {str(path)!r} is quantized (quantization_config, "
                                    f"quant_method {method!r}); headprune prunes and loads unquantized weights "
                                    "only: dequantize the model first")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in transformers.CONFIG_MAPPING:
        raise UnsupportedModelError(f"model directory {str(path)!r}: model_type {model_type!r} is not one "
                                    f"transformers {transformers.__version__} knows")
    return raw


def hf_config(path: Path):
    """transformers' config of the directory ``path`` after :func:`read_config`'s checks; a config transformers
    refuses is one typed line naming the directory."""
    read_config(path)
    try:
        return transformers.AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise UnsupportedModelError(f"config.json in {str(path)!r} cannot be loaded by transformers "
                                    f"{transformers.__version__}: {str(e).strip().splitlines()[0]}") from None


def pruned_record(raw: dict, path: Path) -> tuple[dict | None, dict | None]:
    """The kept heads and original head counts recorded in a config dict (current or 0.1.0 names);
    ``(None, None)`` for an unpruned model. Types are checked here, indices by ``heads_to_drop``."""
    kept, original = (_record(raw, key) for key in (KEPT_KEY, ORIGINAL_KEY))
    if not kept:
        return None, None
    if not isinstance(kept, Mapping):
        raise PlanError(f"{KEPT_KEY} in {str(path)!r}/config.json must be a mapping site -> kept head indices, "
                        f"got {type(kept).__name__} {kept!r:.80}")
    if original is not None and not (isinstance(original, Mapping) and all(
            isinstance(n, int) and not isinstance(n, bool) for n in original.values())):
        raise PlanError(f"{ORIGINAL_KEY} in {str(path)!r}/config.json must be a mapping site -> number of heads, "
                        f"got {original!r:.80}")
    return dict(kept), None if original is None else dict(original)


def _record(raw: dict, key: str):
    value = raw.get(key)
    return raw.get(LEGACY_KEYS[key]) if value is None else value


def weight_files(path: Path, *, required: bool) -> str | None:
    """The name of the directory's weights file (single file or index) after checking that every
    safetensors file it names is whole; None when there is none and ``required`` is false."""
    name = next((n for n in WEIGHT_NAMES if (path / n).is_file()), None)
    if name is None:
        if required:
            raise DataError(f"no weights in {str(path)!r}: expected {PRUNED_WEIGHTS} (or {PLAIN_WEIGHTS}, or a "
                            "sharded index)")
        return None
    files = [name]
    if name.endswith(".index.json"):
        try:
            files = sorted(set(json.loads((path / name).read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise DataError(f"weights index {name} in {str(path)!r} cannot be read ({type(e).__name__}: {e})") from None
    for file in files:
        try:
            with safe_open(path / file, framework="pt") as handle:  # reads and checks the header only
                handle.keys()
        except (OSError, SafetensorError) as e:
            raise DataError(f"weights file {file} in {str(path)!r} is not a whole safetensors file ({e}); "
                            "truncated or overwritten?") from None
    return name


# ---------------------------------------------------------------- writing a directory

def check_output_dir(path: str | Path) -> Path:
    """Refuse an output path that is a file or a non-empty directory (an empty directory is fine)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output {str(path)!r} already exists and is a file; a saved model is a directory: "
                          "choose a new path")
    if path.is_dir() and any(path.iterdir()):
        raise ConfigError(f"output {str(path)!r} already exists and is not empty; choose a new directory")
    check_writable(path)
    return path


def check_writable(path: str | Path) -> None:
    """Refuse, naming ``path``, an output that cannot be written: the directory itself when it exists, else
    the nearest folder above it that exists (where it and its temporary sibling would be made) must take
    new files. Checked before any work, not found out from a temporary file's ``[Errno 30]``."""
    path = Path(path)
    for where in (path, *path.absolute().parents):
        if where.exists():
            break
    if os.access(where, os.W_OK):
        return
    try:
        read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows)
        read_only = False
    why = "is on a read-only file system" if read_only else "is not writable (no write permission)"
    which = "" if where == path else f" (its folder {str(where)!r})"
    raise ConfigError(f"output {str(path)!r}{which} {why}; choose a directory you can write to")


@contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory of ``path``; on success it is renamed to ``path``, on any
    failure it is removed, so ``path`` is either complete or absent (or still the empty directory it was)."""
    check_output_dir(path)
    tmp = path.parent / f".{path.name}.headprune-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()  # not mkdtemp: the output keeps the usual permissions
    except OSError as e:  # e.g. a file system that became read-only: name the output, not the temporary folder
        raise ConfigError(f"output {str(path)!r} cannot be written ({e.strerror}); choose a directory you can "
                          "write to") from None
    try:
        yield tmp
        if path.is_dir():
            try:
                path.rmdir()  # empty (checked above): replaced by the finished directory
            except OSError as e:
                why = "is no longer empty" if e.errno in (errno.ENOTEMPTY, errno.EEXIST) else \
                    f"cannot be replaced ({e.strerror})"
                raise ConfigError(f"output {str(path)!r} {why}; choose a new directory") from None
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def finish_layout(directory: Path, model: nn.Module, pruned: bool) -> None:
    """Turn what ``save_pretrained`` wrote into headprune's layout: the attention implementation in
    config.json always; for a pruned model the weights renamed, the marker and the note."""
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    attn = getattr(model.config, "_attn_implementation", None)
    if isinstance(attn, str):
        config[ATTN_KEY] = attn
    if pruned:
        renamed = [(a, b) for a, b in ((PLAIN_WEIGHTS, PRUNED_WEIGHTS), (PLAIN_INDEX, PRUNED_INDEX))
                   if (directory / a).is_file()]
        if not renamed:
            raise DataError(f"save_pretrained wrote neither {PLAIN_WEIGHTS} nor {PLAIN_INDEX}; cannot save")
        for a, b in renamed:
            os.replace(directory / a, directory / b)
        config[MARKER_KEY] = MARKER
        (directory / NOTE).write_text(NOTE_TEXT, encoding="utf-8")
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- loading a pruned model through transformers

def from_pretrained_pruned(cls: type, path: Path, config, kept: dict, original: dict | None, weights: str, *,
                           strict: bool = True, **kwargs) -> nn.Module:
    """``cls.from_pretrained(path, ...)`` for a pruned directory, so transformers' own loading applies
    (checkpoint key conversions, tied weights, dtype, attention implementation, generation config).

    transformers builds the model by calling ``cls(config)`` and then loads the checkpoint into it.
    A subclass that is ``cls`` in all but ``__init__`` (same name and module, so transformers looks
    up the same key conversions and does not treat it as custom code) replays the kept heads right
    after building, so the checkpoint meets the pruned shapes; the instance gets back class ``cls``
    afterwards. transformers re-creates non-persistent buffers it does not know (RepeatHeads'
    index) empty: those of headprune's modules are put back from the freshly built skeleton.

    Weights of the wrong shape or missing (newly initialised) always raise :class:`PlanError`;
    unexpected ones too when ``strict`` (not when the caller chose another class, e.g. the base model
    of a checkpoint with a head: then transformers' own load report says what was dropped).
    """
    config = copy.deepcopy(config)  # the caller's stays untouched
    neurons = tuple(getattr(config, key, None) for key in (KEPT_NEURONS_KEY, ORIGINAL_NEURONS_KEY))
    for key in (KEPT_KEY, ORIGINAL_KEY, *LEGACY_KEYS.values(), KEPT_NEURONS_KEY, ORIGINAL_NEURONS_KEY):
        if hasattr(config, key):
            delattr(config, key)
    setattr(config, MARKER_KEY, weights)  # the file transformers reads (its field for non-standard names)
    verbosity = hf_logging.get_verbosity()
    if strict:
        hf_logging.set_verbosity_error()  # the load report: a misfit raises PlanError below instead
    try:
        model, info = _replaying(cls, kept, original, neurons).from_pretrained(
            path, config=config, ignore_mismatched_sizes=True, output_loading_info=True, **kwargs)
    except PlanError as e:  # from heads_to_drop: kept heads that do not fit the model's config
        raise PlanError(f"{KEPT_KEY} in {str(path)!r}/config.json: {e}") from None
    except RuntimeError as e:  # a conversion that failed, or a tensor that cannot be copied
        raise PlanError(f"weights in {str(path)!r} do not fit the kept heads in its config.json: "
                        f"{str(e).strip().splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    model.__class__ = cls
    restore = model.__dict__.pop("_hp_buffers")
    with torch.no_grad():
        for name, value in restore.items():
            model.get_buffer(name).copy_(value)
    if hasattr(model.config, MARKER_KEY):
        delattr(model.config, MARKER_KEY)
    misfit = {"wrong shape": sorted(f"{k} {tuple(a)} vs {tuple(b)}" for k, a, b in info["mismatched_keys"]),
              "missing": sorted(set(info["missing_keys"]) - tied_keys(model, set(info["missing_keys"])))}  # newly initialised: refused whatever the class
    if strict:
        misfit.update(unexpected=sorted(info["unexpected_keys"]))
    misfit = {k: v for k, v in misfit.items() if v}
    if misfit or info["error_msgs"]:
        detail = "; ".join(f"{k} {v[:3]}{' ...' if len(v) > 3 else ''}" for k, v in misfit.items())
        raise PlanError(f"weights in {str(path)!r} do not fit the kept heads in its config.json: "
                        f"{detail or info['error_msgs'][0]}")
    return model


def _replaying(cls: type, kept: dict, original: dict | None, neurons: tuple = (None, None)) -> type:
    """``cls`` whose ``__init__`` also replays ``kept`` and the kept FFN neurons ``neurons`` ((kept, original)
    or Nones; see :func:`from_pretrained_pruned`)."""
    from transformers.initialization import no_init_weights

    def __init__(self, config, *args, **kwargs):
        # transformers builds on the meta device; surgery needs values (RepeatHeads' index), so the
        # skeleton is built on the CPU, uninitialised as _from_config would (weights are loaded next)
        with torch.device("cpu"), no_init_weights():
            cls.__init__(self, config, *args, **kwargs)
            add_zero_biases(self, added_biases(self))  # biases headprune added (before the cut that keeps them)
            cut_heads(self, heads_to_drop(self, kept, original))  # verified when it was pruned
            if neurons[0]:
                cut_neurons(self, neurons_to_drop(self, neurons[0], neurons[1]))
        own = {name: module for name, module in self.named_modules() if _is_headprune(module)}
        for module in own.values():  # its weights all come from the checkpoint; and transformers' init of
            module._is_hf_initialized = True  # e.g. T5Attention would reach for projections surgery deleted
        persistent = set(self.state_dict())
        self.__dict__["_hp_buffers"] = {n: b.detach().clone() for n, b in self.named_buffers()
                                        if n not in persistent and n.rpartition(".")[0] in own}

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})


def _is_headprune(module: nn.Module) -> bool:
    """A module surgery installed or re-classed (RepeatHeads, BiasOnly, a removed or pruned attention)."""
    return type(module).__module__.startswith("headprune.")
