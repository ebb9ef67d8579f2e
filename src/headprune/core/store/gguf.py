"""Models where users keep them: a GGUF file (llama.cpp's format) as a plain float PyTorch model.

transformers reads GGUF itself (``from_pretrained(folder, gguf_file=name)``: the architecture, the
config and the tokenizer come from the file's metadata, quantized weights are de-quantised to the
dtype asked for). headprune then rebuilds the model as its plain class without the
``quantization_config`` that marks it GGUF-loaded, so it can be pruned and saved like any other: built on the
meta device and handed the loaded tensors, so the weights are never held twice.
Decoder-only language models (Llama, Qwen2, Mistral, ... GGUF's families) load as
``AutoModelForCausalLM``. Needs the ``gguf`` package (the ``demo`` extra).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...errors import ConfigError, UnsupportedModelError
from ...extras import require
from .quiet import transformers_bars_off


def is_gguf(path: str | Path) -> bool:
    """A path that names a GGUF file (by its suffix)."""
    return str(path).lower().endswith(".gguf")


def load_gguf(file: str | Path, *, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model in the GGUF ``file``, de-quantised to ``dtype``, as a plain transformers model in eval mode."""
    from transformers import AutoModelForCausalLM

    path = _check(file)
    require("gguf", "loading a GGUF file")
    require("accelerate", "loading a GGUF file")
    import transformers.modeling_gguf_pytorch_utils  # noqa: F401  (loaded now, so its bar can be turned off)

    try:
        with transformers_bars_off():
            loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                          local_files_only=True)
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise UnsupportedModelError(f"GGUF file {str(path)!r} cannot be loaded by transformers: "
                                    f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a de-quantised copy: transformers refuses to save GGUF-loaded models
    with torch.device("meta"):  # no second set of weights: the loaded model's tensors are handed over
        model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    for name, buffer in loaded.named_buffers():  # those not in the state dict (non-persistent: rotary frequencies)
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        if module._buffers.get(attr) is not None and module._buffers[attr].is_meta:
            module._buffers[attr] = buffer
    model.tie_weights()
    del loaded
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise UnsupportedModelError(f"GGUF file {str(path)!r}: {type(model).__name__} has tensors transformers did not "
                                    f"load ({', '.join(left[:3])})")
    return model.to(dtype).eval()


def load_gguf_tokenizer(file: str | Path):
    """The tokenizer stored in the GGUF ``file``'s metadata."""
    from transformers import AutoTokenizer

    path = _check(file)
    require("gguf", "loading a GGUF file")
    require("accelerate", "loading a GGUF file")
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


def _check(file: str | Path) -> Path:
    path = Path(file)
    if not path.is_file():
        raise ConfigError(f"GGUF file {str(path)!r} does not exist; expected a .gguf file or a Hugging Face model "
                          "directory")
    return path
