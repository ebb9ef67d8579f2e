"""What a GGUF file holds, counted from the file itself: bytes, tensors per type, parameters, shapes per layer.

Read with the ``gguf`` package's ``GGUFReader`` (memory-mapped; nothing is de-quantised), so it serves files
any writer made: headprune's exporter and llama.cpp's quantizer alike. :func:`wider_than` compares two files
tensor by tensor: the tensors one stores in more bytes per weight than the other (a pruned width off the
quantisation block falls back to a wider type).
"""

from __future__ import annotations

from pathlib import Path

from ..extras import require

__all__ = ["gguf_inventory", "wider_than", "bytes_per_weight"]


def bytes_per_weight(type_name: str) -> float:
    """Bytes one weight of GGML type ``type_name`` takes (``Q8_0``: 34 bytes per block of 32)."""
    gguf = require("gguf", "reading GGUF")
    block, size = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, type_name)]
    return size / block


def gguf_inventory(path: str | Path) -> dict:
    """``{"bytes": file size, "tensor_bytes", "params": elements of every tensor, "types": {type: tensors},
    "tensors": {name: [type, elements, bytes, shape [out, in]]}, "meta": shape fields}`` of the GGUF file ``path``.

    ``meta``: the architecture, its per-layer ``head_count`` / ``head_count_kv`` / ``feed_forward_length``
    (lists, one value per layer), ``embedding_length``, ``block_count``, ``key_length`` and ``vocab_size``."""
    gguf = require("gguf", "reading GGUF")
    path = Path(path)
    reader = gguf.GGUFReader(path)
    tensors: dict[str, list] = {}
    types: dict[str, int] = {}
    for t in reader.tensors:
        name = t.tensor_type.name
        tensors[t.name] = [name, int(t.n_elements), int(t.n_bytes), [int(n) for n in reversed(t.shape.tolist())]]
        types[name] = types.get(name, 0) + 1
    arch = str(reader.fields["general.architecture"].contents())
    layers = int(reader.fields[f"{arch}.block_count"].contents())

    def field(key: str, per_layer: bool = False):
        f = reader.fields.get(key)
        value = None if f is None else f.contents()
        if per_layer and value is not None and not isinstance(value, list):
            value = [value] * layers
        return value

    vocab = field(f"{arch}.vocab_size") or tensors["token_embd.weight"][3][0]
    meta = {"arch": arch, "block_count": layers, "embedding_length": field(f"{arch}.embedding_length"),
            "head_count": field(f"{arch}.attention.head_count", True),
            "head_count_kv": field(f"{arch}.attention.head_count_kv", True),
            "feed_forward_length": field(f"{arch}.feed_forward_length", True),
            "key_length": field(f"{arch}.attention.key_length"), "vocab_size": int(vocab)}
    if meta["key_length"] is None:
        meta["key_length"] = meta["embedding_length"] // max(meta["head_count"])
    return {"bytes": path.stat().st_size, "tensor_bytes": sum(v[2] for v in tensors.values()),
            "params": sum(v[1] for v in tensors.values()), "types": dict(sorted(types.items())),
            "tensors": tensors, "meta": meta}


def wider_than(inventory: dict, reference: dict) -> list[str]:
    """Tensors of ``inventory`` stored in more bytes per weight than the tensor of the same name in
    ``reference`` (both :func:`gguf_inventory` results; tensors only one file has are not compared)."""
    out = []
    for name, (kind, *_rest) in inventory["tensors"].items():
        other = reference["tensors"].get(name)
        if other is not None and bytes_per_weight(kind) > bytes_per_weight(other[0]):
            out.append(name)
    return sorted(out)
