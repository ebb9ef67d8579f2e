"""The tokenizer in a GGUF file: copied from the model's source GGUF, or converted from a Hugging Face
byte-level BPE tokenizer (GPT-2, Llama-3, Qwen, SmolLM: llama.cpp's ``gpt2`` tokenizer model).

:func:`vocab_fields` returns ``[(key, value, value type, sub type)]`` for ``GGUFWriter.add_key_value``.
From a source GGUF every ``tokenizer.*`` field is carried over as stored (tokens, merges, scores,
types, special ids, the pre-tokenizer name llama.cpp picks its splitting rules by, the chat template).
From a Hugging Face tokenizer: the vocabulary in id order, the merges, token types (special tokens as
control tokens, ids past the tokenizer's length as unused padding up to the embedding's rows), the
special ids and whether a BOS token is prepended. The pre-tokenizer is written as ``default``: llama.cpp
then splits text with GPT-2's rule, so text tokenized by llama.cpp itself may differ from the Hugging
Face tokenizer on digits and some punctuation; token ids fed to the model are unaffected (the checks
in this package feed ids).
"""

from __future__ import annotations

import json
from pathlib import Path

from .gguf_layout import GGUFShapeError

NORMAL, CONTROL, UNUSED = 1, 3, 5  # llama.cpp token types


def vocab_fields(vocab_size: int, *, tokenizer=None, source_gguf: str | Path | None = None) -> list[tuple]:
    """``tokenizer.*`` key/values for a GGUF file whose embedding has ``vocab_size`` rows."""
    from gguf import GGUFValueType

    if source_gguf is not None:
        return _copied(Path(source_gguf), vocab_size)
    if tokenizer is None:
        raise GGUFShapeError("no tokenizer: pass tokenizer= (a Hugging Face tokenizer) or source_gguf= (a GGUF file "
                             "whose tokenizer to carry over); llama.cpp loads no model without a vocabulary")
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    spec = json.loads(backend.to_str()) if backend is not None else {}
    model = spec.get("model", {})
    if model.get("type") != "BPE" or not _byte_level(spec):
        raise GGUFShapeError(f"tokenizer {type(tokenizer).__name__} ({model.get('type', 'not a fast tokenizer')}): "
                             "converted to GGUF are byte-level BPE tokenizers only; pass source_gguf= to carry "
                             "over a GGUF file's tokenizer instead")
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    if max(by_id) >= vocab_size:
        raise GGUFShapeError(f"tokenizer has token id {max(by_id)}, the embedding only {vocab_size} rows")
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(CONTROL if i in special else NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    fields = [("tokenizer.ggml.model", "gpt2", GGUFValueType.STRING, None),
              ("tokenizer.ggml.pre", "default", GGUFValueType.STRING, None),
              ("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, GGUFValueType.STRING),
              ("tokenizer.ggml.token_type", types, GGUFValueType.ARRAY, GGUFValueType.INT32),
              ("tokenizer.ggml.merges", merges, GGUFValueType.ARRAY, GGUFValueType.STRING)]
    for key, attr in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unknown", "unk_token_id"),
                      ("padding", "pad_token_id")):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            fields.append((f"tokenizer.ggml.{key}_token_id", int(value), GGUFValueType.UINT32, None))
    bos = getattr(tokenizer, "bos_token_id", None)
    adds_bos = bos is not None and tokenizer("a")["input_ids"][:1] == [bos]
    fields.append(("tokenizer.ggml.add_bos_token", bool(adds_bos), GGUFValueType.BOOL, None))
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        fields.append(("tokenizer.chat_template", template, GGUFValueType.STRING, None))
    return fields


def _byte_level(spec: dict) -> bool:
    def kinds(node) -> set:
        if not isinstance(node, dict):
            return set()
        found = {node.get("type")}
        for child in node.get("pretokenizers", []) or node.get("decoders", []) or []:
            found |= kinds(child)
        return found
    return "ByteLevel" in kinds(spec.get("pre_tokenizer")) | kinds(spec.get("decoder"))


def _copied(path: Path, vocab_size: int) -> list[tuple]:
    from gguf import GGUFReader, GGUFValueType

    if not path.is_file():
        raise GGUFShapeError(f"source_gguf {str(path)!r} does not exist")
    reader = GGUFReader(path)
    fields = []
    for name, f in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY and len(f.types) > 1 else None
        fields.append((name, f.contents(), vtype, sub))
    tokens = next((v for k, v, *_ in fields if k == "tokenizer.ggml.tokens"), None)
    if tokens is None:
        raise GGUFShapeError(f"source_gguf {str(path)!r} holds no tokenizer (tokenizer.ggml.tokens)")
    if len(tokens) != vocab_size:
        raise GGUFShapeError(f"source_gguf {str(path)!r} has {len(tokens)} tokens, the model's embedding "
                             f"{vocab_size} rows")
    return fields
