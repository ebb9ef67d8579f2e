"""Models where users keep them: a GGUF file (llama.cpp's format) as a plain float PyTorch model.

transformers reads GGUF itself (``from_pretrained(folder, gguf_file=name)``: the architecture, the
config and the tokenizer come from the file's metadata, quantized weights are de-quantised to the
dtype asked for). headprune then rebuilds the model as its plain class without the
``quantization_config`` that marks it GGUF-loaded, so it can be pruned and saved like any other. For the families
whose tensors transformers' GGUF reader converts one at a time (Llama, Qwen2, Mistral, Gemma 2/3, ...: its
per-tensor processors), the file is read one tensor at a time instead: the model is built on the meta device and each
tensor is de-quantised, converted by transformers' own processor and name map, and put in place, so the process never
holds a second copy of the weights (transformers de-quantises the whole file before the model takes it). Other
families are loaded by transformers and rebuilt around its tensors.
Decoder-only language models (Llama, Qwen2, Mistral, ... GGUF's families) load as
``AutoModelForCausalLM``. Needs the ``gguf`` package (the ``demo`` extra).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
            model = _streamed(path, dtype)
            if model is None:
                model = _rebuilt(AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                                      local_files_only=True))
    except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as e:
        raise UnsupportedModelError(f"GGUF file {str(path)!r} cannot be loaded by transformers: "
                                    f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    model.tie_weights()
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise UnsupportedModelError(f"GGUF file {str(path)!r}: {type(model).__name__} has tensors transformers did not "
                                    f"load ({', '.join(left[:3])})")
    return model.to(dtype).eval()


def _rebuilt(loaded: nn.Module) -> nn.Module:
    """``loaded`` (transformers' GGUF load) as its plain class without ``quantization_config``, holding its tensors."""
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
    return model


def _streamed(path: Path, dtype: torch.dtype) -> nn.Module | None:
    """The model read one tensor at a time, as transformers' GGUF reader converts each (its processor and name map);
    None for a family whose processor is not per tensor (mixture-of-experts ones fill several tensors at once) or
    that transformers reads through its newer block loader."""
    from accelerate import init_empty_weights
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM

    try:  # transformers' GGUF internals: where a version lacks or renames them, its own whole-file load is used
        from transformers import modeling_gguf_pytorch_utils as legacy
        from transformers.integrations.gguf.reader import read_gguf_metadata
        from transformers.integrations.gguf.utils import is_gguf_arch_supported

        arch = read_gguf_metadata(str(path))[0]["general.architecture"]  # the vocabulary left unread
        processor_class = legacy.TENSOR_PROCESSORS.get(arch, legacy.TensorProcessor)
        per_tensor = _per_tensor(legacy)
    except (ImportError, AttributeError):
        return None
    if is_gguf_arch_supported(arch) or processor_class not in per_tensor:
        return None
    parsed = legacy.load_gguf_checkpoint(str(path), return_tensors=False)  # metadata only, as transformers reads it
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary frequencies) computed
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    processor = processor_class(config=parsed["config"])
    names = legacy.get_gguf_hf_weights_map(model, processor)
    tensors = GGUFReader(str(path)).tensors  # memory-mapped; the reader's parsed metadata (the vocabulary) let go
    for tensor in tensors:
        result = processor.process(weights=_dequantized(tensor), name=tensor.name, tensor_key_mapping=names,
                                   parsed_parameters=parsed)
        if result.name in names:
            _put(model, names[result.name], _owned(result.weights), dtype)
    return model


def _dequantized(tensor, rows: int = 1024) -> np.ndarray:
    """A GGUF reader's ``tensor`` as floats, ``rows`` rows at a time (its blocks never span rows), so that
    de-quantising a large tensor (an embedding) needs no full-size temporaries beside its result."""
    from gguf.quants import dequantize

    data = tensor.data  # [rows, bytes per row] for block types, else [rows, columns]
    if data.ndim < 2 or data.shape[0] <= rows:
        return dequantize(data, tensor.tensor_type)
    first = dequantize(data[:rows], tensor.tensor_type)
    out = np.empty((data.shape[0], *first.shape[1:]), dtype=first.dtype)
    out[:rows] = first
    for start in range(rows, data.shape[0], rows):
        out[start:start + rows] = dequantize(data[start:start + rows], tensor.tensor_type)
    return out


def _per_tensor(legacy) -> tuple:
    """transformers' GGUF tensor processors (of its module ``legacy``) that convert each tensor on its own."""
    return (legacy.TensorProcessor, legacy.LlamaTensorProcessor, legacy.Gemma2TensorProcessor,
            legacy.NemotronTensorProcessor)


def _owned(weights: np.ndarray) -> torch.Tensor:
    """``weights`` as a tensor: shared when already a writable C-ordered array, else copied once (a memory-mapped
    float32 tensor of the file is read-only)."""
    if not (weights.flags.writeable and weights.flags.c_contiguous):
        weights = np.copy(weights)
    return torch.from_numpy(weights)


def _put(model: nn.Module, name: str, value: torch.Tensor, dtype: torch.dtype) -> None:
    """Parameter or persistent buffer ``name`` of ``model`` set to ``value`` (in ``dtype``), shapes checked."""
    owner, _, attr = name.rpartition(".")
    module = model.get_submodule(owner)
    old = module._parameters.get(attr, module._buffers.get(attr))
    if old is None or tuple(old.shape) != tuple(value.shape):
        raise ValueError(f"tensor {name}: shape {tuple(value.shape)} where the model has "
                         f"{None if old is None else tuple(old.shape)}")
    value = value.to(dtype if old.is_floating_point() else old.dtype)
    if attr in module._parameters:
        module._parameters[attr] = nn.Parameter(value, requires_grad=old.requires_grad)
    else:
        module._buffers[attr] = value


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
