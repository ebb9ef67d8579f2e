"""``export_gguf``: a (pruned) decoder as one GGUF file that llama.cpp runs, checked before it is kept.

The file is written to a temporary sibling, read back and checked, and only then renamed into place
(a failed check or an interrupted write leaves nothing at ``output``). The checks, all on the file
itself:

1. **metadata**: the per-layer head, key/value-head and FFN counts read back equal the model's modules;
2. **tensors**: every tensor read back (de-quantised, rope permutation undone) equals the model's weight
   (float32: exactly; float16 and quantised types: within :data:`TENSOR_TOLERANCE` of the tensor's
   largest magnitude), and no tensor is missing or extra;
3. **logits**: the read-back weights put into a copy of the model give logits within ``tolerance``
   (relative to the largest logit) of the model's for float32; for other types the difference is
   reported (it is the quantisation's effect, not an error);
4. **transformers' GGUF reader** (``llama``/``qwen2``/``qwen3`` files with the same shapes in every
   layer): transformers builds its own model from the file's metadata and weights, and its logits must
   match the read-back copy's within ``tolerance``. A file whose per-layer shapes only llama.cpp reads
   (``deci``) skips this with the reason in the report; llama.cpp itself is checked by the tests and the
   benchmark where ``llama-cpp-python`` is installed (:mod:`.llamacpp`).

Types (``outtype``): ``f32``, ``f16``, and the block quantisations the ``gguf`` package writes,
``q8_0``, ``q5_0``, ``q5_1``, ``q4_0``, ``q4_1`` (2-D weights only; norms stay float32, as in
llama.cpp's converter; a weight whose rows are not a multiple of the 32-value block falls back to
float16 and is listed in the report, ``fallback_f16``; ``wider_than_unpruned`` lists those the unpruned
model would have quantised: a pruned width off the block, which ``multiple_of`` avoids). K-quants (``Q4_K``...) are made from an f32/f16 file with
llama.cpp's own quantizer (:func:`.llamacpp.quantize_gguf`).
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..core.model.ffn import find_ffns
from ..core.model.kept import original_heads, original_neurons
from ..core.model.sites import find_sites
from ..errors import ConfigError
from ..extras import require
from ..provenance import __version__, own_name, portable, versions
from .gguf_layout import ZERO_FFN, GGUFShapeError, Layout, gguf_layout, rope_unpermute
from .gguf_vocab import vocab_fields
from .onnx import SENTENCES, ExportError

OUTTYPES = ("f32", "f16", "q8_0", "q5_0", "q5_1", "q4_0", "q4_1")
TENSOR_TOLERANCE = {"F32": 0.0, "F16": 1e-3, "Q8_0": 1e-2, "Q5_0": 7e-2, "Q5_1": 7e-2, "Q4_0": 0.13, "Q4_1": 0.13}  # of the largest |w|: half a step, or a step where a block clips
TRANSFORMERS_ARCHS = ("llama", "qwen2", "qwen3")

__all__ = ["OUTTYPES", "GGUFShapeError", "export_gguf", "read_gguf_tensors", "with_gguf_weights"]


def export_gguf(model: nn.Module, output: str | Path, *, tokenizer=None, source_gguf: str | Path | None = None,
                outtype: str = "f32", tolerance: float = 1e-4, name: str | None = None,
                signature: dict | None = None, reload: bool = True, zero_ffn: int = ZERO_FFN) -> dict:
    """Write ``model`` to the new GGUF file ``output`` (+ ``output.json``, the report) once it checks out.

    ``tokenizer`` (a Hugging Face byte-level BPE tokenizer) or ``source_gguf`` (a GGUF file whose
    tokenizer is carried over) gives the vocabulary. Refused before anything is written: a shape or
    family llama.cpp cannot run exactly (:class:`GGUFShapeError`), an ``outtype`` not in
    :data:`OUTTYPES`, an existing ``output``. Returns the report (shapes, types, checks, versions).
    ``reload=False`` skips check 4 (transformers' reader: one more model load), e.g. in a benchmark.
    ``zero_ffn``: neurons of zeros written for an FFN with none left (:func:`.gguf_layout.gguf_layout`).
    ``name`` (``general.name``; default: the base name of the config's ``_name_or_path``, else the class) and
    ``signature`` (``headprune.signature`` and the report) hold no absolute path of this machine: a published
    file names its model, not the exporter's folders (:func:`headprune.provenance.portable`).
    """
    gguf = require("gguf", "GGUF export")
    output = Path(output)
    if outtype not in OUTTYPES:
        raise ConfigError(f"outtype {outtype!r}; allowed: {', '.join(OUTTYPES)}")
    if not 0 < tolerance < 1:
        raise ConfigError(f"tolerance {tolerance}; allowed: a number between 0 and 1")
    if output.suffix.lower() != ".gguf":
        raise ConfigError(f"output {str(output)!r}; allowed: a file name ending in .gguf")
    if output.exists() or Path(str(output) + ".json").exists():
        raise ConfigError(f"output {str(output)!r} (or its .json report) already exists; allowed: a new file")
    if not output.parent.is_dir():
        raise ConfigError(f"output directory {str(output.parent)!r} does not exist")
    model = model.eval()
    layout = gguf_layout(model, zero_ffn=zero_ffn)
    vocab = vocab_fields(layout.vocab_size, tokenizer=tokenizer, source_gguf=source_gguf)
    tmp = output.parent / f".{output.stem}.{uuid.uuid4().hex[:8]}.tmp.gguf"
    try:
        written = _write(gguf, layout, vocab, tmp, outtype, _model_name(model, name), portable(signature or {}))
        checks = check_gguf(model, layout, tmp, written, tokenizer=tokenizer, tolerance=tolerance, reload=reload)
        report = {"format": "gguf", "file": output.name, "arch": layout.arch, "family": layout.family,
                  "outtype": outtype, "bytes": tmp.stat().st_size,
                  "uniform": layout.uniform, "tied_embeddings": layout.tied,
                  "head_count": layout.per_layer("n_head"), "head_count_kv": layout.per_layer("n_head_kv"),
                  "feed_forward_length": layout.per_layer("n_ff"), "head_dim": layout.head_dim,
                  "zero_ffn_layers": [i for i, s in enumerate(layout.kept) if s.n_ff == 0],
                  "kept": {"head_count": [s.n_head for s in layout.kept],
                           "head_count_kv": [s.n_head_kv for s in layout.kept],
                           "feed_forward_length": [s.n_ff for s in layout.kept]},
                  "padded_tensors": len(layout.placed) + len(layout.padded),
                  "sliding_window": layout.sliding_window, "sliding_layers": layout.swa_layers,
                  "tensor_types": _count(written), "fallback_f16": sorted(n for n, t in written.items()
                                                                          if t == "F16" and outtype.startswith("q")),
                  "wider_than_unpruned": wider_than_unpruned(gguf, model, layout, outtype, written),
                  "tokenizer": "source GGUF" if source_gguf is not None else "Hugging Face tokenizer",
                  "check": checks, "signature": portable(signature or {}), "versions": versions()}
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    side = output.parent / f".{output.name}.{uuid.uuid4().hex[:8]}.json"
    side.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    os.replace(side, Path(str(output) + ".json"))
    return report


def _model_name(model: nn.Module, name: str | None) -> str:
    """``general.name``: ``name``, or the model's own name (``/home/me/runs/tiny`` -> ``tiny``); an absolute path by
    its base name."""
    name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
    return own_name(name) if os.path.isabs(str(name)) or Path(str(name)).exists() else str(name)


def _qtype(gguf, outtype: str, shape: tuple[int, ...]):
    """The GGML type a tensor of ``shape`` ([out, in]) is written in: quantised along its input dimension in
    blocks, float16 where that dimension is not a multiple of the block."""
    Q = gguf.GGMLQuantizationType
    if len(shape) == 1 or outtype == "f32":
        return Q.F32
    if outtype == "f16":
        return Q.F16
    qtype = getattr(Q, outtype.upper())
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return qtype if shape[-1] % block == 0 else Q.F16


def wider_than_unpruned(gguf, model: nn.Module, layout: Layout, outtype: str, written: dict[str, str]) -> list[str]:
    """Tensors written in a wider type (more bytes per weight) than the same tensor of the unpruned model would
    be: an output projection (``attn_output``, input heads x head_dim) or ``ffn_down`` (input: the FFN width)
    whose pruned width is not a multiple of the quantisation block where the unpruned one was
    (``multiple_of`` in :class:`~headprune.compression.settings.PruneSettings` keeps them aligned)."""
    heads = original_heads(model)
    widths = original_neurons(model)
    unpruned = {f"blk.{s.layer}.attn_output.weight": heads.get(s.name, s.num_heads) * s.head_dim
                for s in find_sites(model)}
    unpruned |= {f"blk.{f.layer}.ffn_down.weight": widths.get(f.name, f.width) for f in find_ffns(model)}
    sizes = gguf.GGML_QUANT_SIZES
    out = []
    for name, width in unpruned.items():
        if name not in written:
            continue
        before = _qtype(gguf, outtype, (*layout.tensors[name].shape[:-1], width))
        after = getattr(gguf.GGMLQuantizationType, written[name])
        if sizes[after][1] / sizes[after][0] > sizes[before][1] / sizes[before][0]:
            out.append(name)
    return sorted(out)


def _write(gguf, layout: Layout, vocab: list[tuple], path: Path, outtype: str, name: str,
           signature: dict) -> dict[str, str]:
    """Write the GGUF file; returns {tensor name: GGML type name}."""
    w = gguf.GGUFWriter(path, layout.arch)
    w.add_name(str(name))
    w.add_context_length(layout.context_length)
    w.add_embedding_length(layout.hidden)
    w.add_block_count(len(layout.layers))
    w.add_feed_forward_length(layout.per_layer("n_ff"))
    w.add_head_count(layout.per_layer("n_head"))
    w.add_head_count_kv(layout.per_layer("n_head_kv"))
    w.add_key_length(layout.head_dim)
    w.add_value_length(layout.head_dim)
    w.add_rope_dimension_count(layout.head_dim)
    w.add_rope_freq_base(layout.rope_theta)
    if layout.swa_layers is not None:  # llama.cpp reads the per-layer pattern as an array of bools
        w.add_sliding_window(layout.sliding_window)
        w.add_sliding_window_pattern(layout.swa_layers)
        w.add_rope_freq_base_swa(layout.rope_theta_swa)
    w.add_layer_norm_rms_eps(layout.rms_eps)
    w.add_vocab_size(layout.vocab_size)
    file_type = {"f32": "ALL_F32", "f16": "MOSTLY_F16"}.get(outtype, f"MOSTLY_{outtype.upper()}")
    w.add_file_type(int(getattr(gguf.LlamaFileType, file_type)))
    w.add_string("headprune.version", __version__)
    w.add_string("headprune.signature", json.dumps(signature, sort_keys=True, default=str))
    for key, value, vtype, sub in vocab:
        w.add_key_value(key, value, vtype, sub_type=sub)
    types = {}
    for tname, array in layout.tensors.items():
        qtype = _qtype(gguf, outtype, array.shape)
        types[tname] = qtype.name
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(tname, array.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(tname, array.astype(np.float16))
        else:
            w.add_tensor(tname, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def read_gguf_tensors(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str], dict]:
    """Every tensor of a GGUF file de-quantised to float32 ``[out, in]`` arrays, their GGML types, and the
    metadata fields (``{key: value}``; arrays as lists)."""
    gguf = require("gguf", "reading GGUF")
    reader = gguf.GGUFReader(path)
    arrays, types = {}, {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        arrays[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        types[t.name] = t.tensor_type.name
    meta = {}
    for key, f in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key != "tokenizer.ggml.model":
            continue
        meta[key] = f.contents()
    return arrays, types, meta


def with_gguf_weights(model: nn.Module, path: str | Path) -> nn.Module:
    """A copy of ``model`` holding the weights of the GGUF file ``path`` that :func:`export_gguf` wrote from it
    (de-quantised, rope permutation undone): the file's quality computed in PyTorch."""
    layout = gguf_layout(model)
    arrays, _, _ = read_gguf_tensors(path)
    if set(arrays) != set(layout.tensors):
        raise ExportError(f"GGUF file {str(path)!r} does not hold this model's tensors")
    return _with_weights(model, layout, arrays)


def check_gguf(model: nn.Module, layout: Layout, path: Path, written: dict[str, str], *, tokenizer=None,
               tolerance: float = 1e-4, reload: bool = True) -> dict:
    """Checks 1-4 of the module docstring on the file ``path``; raises :class:`ExportError` on a mismatch."""
    arrays, types, meta = read_gguf_tensors(path)
    arch = layout.arch
    for key, expected in (("head_count", layout.per_layer("n_head")), ("head_count_kv", layout.per_layer("n_head_kv")),
                          ("feed_forward_length", layout.per_layer("n_ff")),
                          ("sliding_window_pattern", layout.swa_layers)):
        got = meta.get(f"{arch}.{key}" if key == "feed_forward_length" else f"{arch}.attention.{key}")
        if got != expected:
            raise ExportError(f"GGUF metadata {key} reads back as {got}, the model has {expected}: the file is not "
                              "kept")
    if set(arrays) != set(layout.tensors) or types != written:
        raise ExportError(f"GGUF tensors read back differ: missing {sorted(set(layout.tensors) - set(arrays))}, "
                          f"extra {sorted(set(arrays) - set(layout.tensors))}: the file is not kept")
    worst = {}
    for tname, want in layout.tensors.items():
        got = arrays[tname]
        scale = float(np.abs(want).max()) or 1.0
        err = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
        if not err <= TENSOR_TOLERANCE[types[tname]] * scale:
            raise ExportError(f"GGUF tensor {tname} ({types[tname]}) reads back {err:.3g} away from the model's "
                              f"weight (largest {scale:.3g}; allowed {TENSOR_TOLERANCE[types[tname]]:g} of it)")
        worst[types[tname]] = max(worst.get(types[tname], 0.0), err / scale)
    ids = _check_ids(model, tokenizer)
    copy_model = _with_weights(model, layout, arrays)
    with torch.no_grad():
        want = model(input_ids=ids).logits.float()
        got = copy_model(input_ids=ids).logits.float()
    scale = float(want.abs().max()) or 1.0
    drift = float((got - want).abs().max())
    exact = all(t == "F32" for t in types.values())
    if exact and not drift <= tolerance * scale:
        raise ExportError(f"logits of the GGUF weights differ from the model's by {drift:.3g} ({drift / scale:.2g} "
                          f"of the largest; allowed {tolerance:g}): the file is not kept")
    report = {"metadata": "per-layer head, key/value-head and FFN counts (and sliding layers) read back equal the "
                          "layout's",
              "tensors": {"count": len(arrays), "max_relative_error_by_type": worst},
              "inputs": list(ids.shape), "logits_max_abs_diff": drift, "logits_relative": drift / scale,
              "logits_tolerance": tolerance if exact else None,
              "transformers": _transformers_check(path, layout, copy_model, got, ids, tolerance) if reload
              else {"checked": False, "reason": "reload=False"}}
    del copy_model
    return report


def _check_ids(model: nn.Module, tokenizer) -> torch.Tensor:
    if tokenizer is not None:
        ids = tokenizer(" ".join(SENTENCES), return_tensors="pt")["input_ids"][:, :48]
        if ids.numel() >= 4:
            return ids
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, model.config.vocab_size, (1, 24), generator=g)


def _with_weights(model: nn.Module, layout: Layout, arrays: dict[str, np.ndarray]) -> nn.Module:
    """A copy of ``model`` holding the file's weights (padding dropped, rope permutation, scale and shift undone)."""
    twin = copy.deepcopy(model)
    params = dict(twin.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for tname, pname in layout.parameters.items():  # not the zeros standing for heads or neurons not kept
            a = arrays[tname]
            if tname in layout.placed:
                axis, index = layout.placed[tname]
                a = np.take(a, index, axis=axis)
            if tname in layout.permuted:
                a = rope_unpermute(a, layout.permuted[tname])
            a = a / layout.scaled.get(tname, 1.0) - layout.shifted.get(tname, 0.0)
            p = params[pname]
            p.copy_(torch.from_numpy(np.ascontiguousarray(a)).to(p.dtype))
    return twin.eval()


def _transformers_check(path: Path, layout: Layout, twin: nn.Module, want: torch.Tensor, ids: torch.Tensor,
                        tolerance: float) -> dict:
    if layout.arch not in TRANSFORMERS_ARCHS:
        return {"checked": False, "reason": f"architecture {layout.arch!r}: transformers' GGUF reader is checked for "
                                            f"{', '.join(TRANSFORMERS_ARCHS)} files only (deci: per-layer shapes it "
                                            "cannot build); llama.cpp checks it instead"}
    biases = sorted(t for t in layout.tensors if t.endswith(("attn_output.bias", "ffn_down.bias")))
    if biases:
        return {"checked": False, "reason": f"{len(biases)} output-projection biases (bias compensation): transformers' "
                                            f"{layout.arch} config gives every projection a bias or none"}
    if layout.arch != "llama" and layout.per_layer("n_head") * layout.head_dim != layout.hidden:
        return {"checked": False, "reason": f"{layout.arch} with heads x head_dim != hidden size: transformers' "
                                            f"{layout.arch} GGUF reader derives head_dim from the hidden size"}
    from ..core import load_model

    try:
        theirs = load_model(path)
    except Exception as e:  # noqa: BLE001 -- any reader failure is reported, the other checks stand
        return {"checked": False, "reason": f"transformers could not read it: {type(e).__name__}: "
                                            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
    with torch.no_grad():
        got = theirs(input_ids=ids).logits.float()
    scale = float(want.abs().max()) or 1.0
    err = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
    if not err <= tolerance * scale:
        raise ExportError(f"transformers' GGUF reader computes logits {err:.3g} away from the file's weights in "
                          f"PyTorch ({err / scale:.2g} of the largest; allowed {tolerance:g}): the file is not kept")
    return {"checked": True, "class": type(theirs).__name__, "max_abs_diff": err, "relative": err / scale,
            "tolerance": tolerance}


def _count(types: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in types.values():
        out[t] = out.get(t, 0) + 1
    return out
