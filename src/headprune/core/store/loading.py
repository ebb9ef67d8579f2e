"""transformers' ``from_pretrained`` held to its own load report: weights that match the config, or a refusal.

transformers builds the model a config names and copies in the checkpoint's tensors; whatever the
checkpoint lacks is drawn at random and only a log notice says so. A Llama config over BERT weights,
or a classifier directory without its classification head, then "loads", and every score, pruned
model or accuracy computed from it is of random weights. :func:`check_load_report` reads the report
(``output_loading_info=True``: missing, unexpected and mismatched keys) and refuses any parameter
newly initialised, naming the first keys and their count, before anything is scored, pruned,
evaluated or written. ``new_head=True`` allows newly initialised parameters outside the base model
only (a fresh classification head, for fine-tuning a headless encoder); such a model carries
:data:`NEW_HEAD_ATTR` and evaluation refuses to report its accuracy as a trained model's.

:func:`load_failure` turns what ``from_pretrained`` raises on a bad directory (a config transformers
refuses to build, a pickle checkpoint ``torch.load(weights_only=True)`` refuses: nothing of it runs)
into one typed line naming the directory.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

from torch import nn

from ...errors import DataError, HeadpruneError, UnsupportedModelError

log = logging.getLogger("headprune")
NEW_HEAD_ATTR = "headprune_new_head"  # instance attribute: the keys newly initialised by new_head=True
SHOWN = 3  # keys named in a message; the rest are counted


def _keys(keys) -> str:
    keys = sorted(str(k) for k in keys)
    more = f" ... ({len(keys)} in all)" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def tied_keys(model: nn.Module, missing: set[str]) -> set[str]:
    """Missing keys whose tensor is another, loaded parameter's (tied embeddings): loaded, not new."""
    state = model.state_dict(keep_vars=True)
    loaded = {state[k].data_ptr() for k in state if k not in missing and state[k].numel()}
    return {k for k in missing if k in state and state[k].numel() and state[k].data_ptr() in loaded}


def _head_keys(model: nn.Module, keys: set[str]) -> set[str]:
    """Those of ``keys`` outside the base model (a task head: ``classifier.*``, ``lm_head.*``)."""
    base = getattr(model, "base_model", model)
    if base is model:
        return set()
    prefix = next((name + "." for name, module in model.named_modules() if module is base), "")
    return {k for k in keys if not k.startswith(prefix)}


def check_load_report(model: nn.Module, info: dict, path: str | Path, *, new_head: bool = False) -> nn.Module:
    """Refuse ``model`` (typed :class:`DataError`, one line) when transformers' load report ``info`` says a
    parameter was newly initialised (missing from the checkpoint, or of another shape). Checkpoint keys the
    model has no use for (a base model from a checkpoint with a head) are logged, not refused: nothing is
    random. ``new_head`` allows missing (or resized) keys outside the base model and marks the model with them."""
    reported = set(map(str, info.get("missing_keys") or ()))
    missing = reported - tied_keys(model, reported)
    unexpected = set(map(str, info.get("unexpected_keys") or ()))
    shapes = {str(k): (tuple(a), tuple(b)) for k, a, b in (info.get("mismatched_keys") or ())}
    fresh = _head_keys(model, missing | set(shapes)) if new_head else set()  # a head of another size: new too
    missing -= fresh
    wrong = sorted(f"{k} {a} vs {b}" for k, (a, b) in shapes.items() if k not in fresh)
    where = f"model directory {str(path)!r}"
    if missing or wrong:
        parts = ([f"{len(missing)} newly initialised (missing from the weights: {_keys(missing)})"] if missing else [])
        parts += [f"{len(wrong)} of another shape in the weights ({_keys(wrong)})"] if wrong else []
        extra = f"; the weights hold {len(unexpected)} keys this model has no use for ({_keys(unexpected)})" \
            if unexpected else ""
        hint = ("; the config does not describe these weights" if unexpected or wrong else
                "; a headless encoder? fine-tune a head first (headprune train classifier)"
                if _head_keys(model, missing) == missing else "")
        raise DataError(f"{where}: weights do not match config.json: parameters {'; '.join(parts)}{extra}{hint}")
    if unexpected:  # nothing random, but something of the checkpoint left out: said, not refused
        log.warning("%s: %d weights the model has no use for were left out (%s)", where, len(unexpected),
                    _keys(unexpected))
    if info.get("error_msgs"):
        raise DataError(f"{where}: weights could not be loaded: {str(info['error_msgs'][0]).strip().splitlines()[0]}")
    if fresh:
        setattr(model, NEW_HEAD_ATTR, sorted(fresh))
    return model


def new_head_keys(model: nn.Module) -> list[str]:
    """The keys a ``new_head=True`` load initialised afresh (empty for a model loaded whole)."""
    return list(getattr(model, NEW_HEAD_ATTR, ()))


def load_failure(e: BaseException, path: str | Path) -> HeadpruneError:
    """What ``from_pretrained`` raised for ``path`` as one typed line naming the directory and the cause."""
    where = f"model directory {str(path)!r}"
    first = (str(e).strip().splitlines() or [""])[0]
    if isinstance(e, pickle.UnpicklingError):
        return DataError(f"{where}: the weights are a pickle checkpoint (pytorch_model.bin) that torch refuses to "
                         "load safely (weights_only=True), and headprune never runs one: convert it to "
                         "safetensors where you trust it (model.save_pretrained(dir, safe_serialization=True))")
    if isinstance(e, OSError):
        return DataError(f"cannot load weights from {str(path)!r}: {first}")
    if isinstance(e, RuntimeError) and "size mismatch" in str(e):
        return DataError(f"{where}: weights do not match config.json (a tensor of another shape): {first}")
    return UnsupportedModelError(f"{where}: transformers cannot build the model its config.json describes "
                                 f"({type(e).__name__}: {first})")
