"""transformers' own progress bars off while headprune loads or saves a model, restored afterwards.

transformers prints "Loading weights", "Writing model shards" and, for a GGUF file, "Converting and
de-quantizing GGUF tensors..." bars of its own; inside headprune's calls the command's output says what
is being done, so headprune decides what is printed. ``with transformers_bars_off(): ...`` (or as a
decorator) turns them off for the block only: a user's own later calls print as they did before.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from contextlib import contextmanager

GGUF_MODULE = "transformers.modeling_gguf_pytorch_utils"  # its bar is plain tqdm, not transformers' switch


@contextmanager
def transformers_bars_off() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    gguf = sys.modules.get(GGUF_MODULE)
    bar = getattr(gguf, "tqdm", None)
    hf_logging.disable_progress_bar()
    if bar is not None:
        setattr(gguf, "tqdm", functools.partial(bar, disable=True))  # noqa: B010  (gguf: a module or None)
    try:
        yield
    finally:
        if bar is not None:
            setattr(gguf, "tqdm", bar)  # noqa: B010
        if was_on:
            hf_logging.enable_progress_bar()
