"""Dependencies by need: the core needs torch + transformers; studies, reports and training need more.

``pip install headprune`` gives masking, scoring, selection, surgery, compression and save/load.
The paper's studies (significance tests, BLEU, figures, reports) and training need the ``study``
extra (``pip install 'headprune[study]'``). A module that needs one of them imports it through
:func:`require`, which says which extra to install instead of failing with a bare ImportError.
"""

from __future__ import annotations

import importlib
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
        top = module.split(".")[0]
        extra = EXTRAS.get(top, "study")
        raise MissingDependencyError(
            f"{purpose} needs the package {top!r}, which is not installed; allowed: install it with "
            f"pip install 'headprune[{extra}]'") from e
