"""Dependencies by need: the core needs torch + transformers; studies, reports and training need more.

``pip install headprune`` gives masking, scoring, selection, surgery, compression and save/load.
The paper's studies (significance tests, BLEU, figures, reports) and training need the ``study``
extra (``pip install 'headprune[study]'``). A module that needs one of them imports it through
:func:`require`, which says which extra to install instead of failing with a bare ImportError.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from .errors import HeadpruneError

EXTRAS = {"scipy": "study", "sacrebleu": "study", "matplotlib": "study", "tokenizers": "study",
          "gguf": "gguf", "accelerate": "gguf", "onnx": "onnx", "onnxruntime": "onnx",
          "llama_cpp": "llamacpp", "lm_eval": "eval"}


class MissingDependencyError(HeadpruneError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (e.g. ``"scipy.stats"``) or raise :class:`MissingDependencyError` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise missing(module, purpose) from e


def installed(module: str, purpose: str) -> None:
    """:func:`require` without the import: for a module only a child process may load (its native code can kill
    the process that loads it; :mod:`headprune.isolation`)."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise missing(module, purpose)


def missing(module: str, purpose: str) -> MissingDependencyError:
    top = module.split(".")[0]
    extra = EXTRAS.get(top, "study")
    return MissingDependencyError(f"{purpose} needs the package {top!r}, which is not installed; allowed: install it "
                                  f"with pip install 'headprune[{extra}]'")
