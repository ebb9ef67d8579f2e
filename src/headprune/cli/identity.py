"""A run's identity beyond paths: the task flags as they took effect and the content hashes of what it read."""

from __future__ import annotations

from ..provenance import data_sha256, model_sha256
from .options import TaskFlags


def identity(flags: TaskFlags, evaluator, model_dir, data: dict) -> dict:
    """What makes a run's results, beyond paths: every task flag (metric, beams, batch size, columns, limit,
    split, label map; defaults as the evaluator resolved them), and the sha256 of the model directory's
    files (a list for several checkpoints) and of each data file or directory read (by flag)."""
    ev = getattr(evaluator, "signature", {})
    options = {**vars(flags), "metric": ev.get("metric", flags.metric),
               "batch_size": ev.get("batch_size", getattr(evaluator, "batch_size", flags.batch_size)), "beams": ev.get("num_beams", flags.beams)}
    models = [model_sha256(m) for m in model_dir] if isinstance(model_dir, list) else model_sha256(model_dir)
    return {"options": options, "model_sha256": models,
            "data_sha256": {flag: content_sha256(path) for flag, path in data.items() if path is not None}}


def content_sha256(path) -> str | None:
    """:func:`headprune.provenance.data_sha256`, and for ``builtin:pydoc`` the hash of the text this Python
    ships (it changes with the Python version)."""
    from ..evaluation.build import PYDOC

    if str(path) == PYDOC:
        import hashlib

        from ..evaluation.data import python_docs_text

        return hashlib.sha256("\n".join(python_docs_text()).encode()).hexdigest()
    return data_sha256(path)
