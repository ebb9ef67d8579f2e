"""``export_onnx``: a (pruned) model as an ONNX graph that onnxruntime runs, checked before it is kept.

The graph takes ``input_ids`` and ``attention_mask`` (``[batch, seq]``, both axes dynamic) and, for
encoder-decoders, ``decoder_input_ids`` (``[batch, tgt]``); it returns the model's first output
(``logits``, or ``last_hidden_state`` for a bare encoder), computed without a key/value cache.
Export uses PyTorch's TorchScript-based exporter (``dynamo=False``: no onnxscript needed), which
traces the pruned model as it runs, RepeatHeads and removed sites included.

Before the directory appears, onnxruntime runs the graph on real inputs -- the model's tokenizer on
English sentences, padded, at another batch size and length than the trace (so the dynamic axes are
exercised), or random ids with padding when there is no tokenizer -- and its outputs are compared
with PyTorch's: the largest difference must be <= ``tolerance`` (1e-4) of the outputs' largest
magnitude, else :class:`ExportError` and nothing is written.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from ..core.model.inputs import unwrap
from ..core.store.checkpoint import atomic_directory, check_output_dir
from ..errors import HeadpruneError
from ..extras import require
from ..provenance import portable, versions

SENTENCES = ["The quick brown fox jumps over the lazy dog.",
             "Attention heads that a trained model does not need can be removed.",
             "Pruned models run faster on the machines where people use them, and keep their quality.",
             "A short one."]
ONNX_FILE = "model.onnx"


class ExportError(HeadpruneError, RuntimeError):
    """An export that cannot be made, or whose graph computes something else than the PyTorch model."""


class _Graph(nn.Module):
    """The forward the graph records: positional tensor inputs, the first output, no cache."""

    def __init__(self, model: nn.Module, seq2seq: bool):
        super().__init__()
        self.model, self.seq2seq = model, seq2seq

    def forward(self, input_ids, attention_mask, decoder_input_ids=None):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "return_dict": True}
        if self.seq2seq:
            kwargs["decoder_input_ids"] = decoder_input_ids
        if getattr(self.model.config, "use_cache", False) or self.seq2seq:
            kwargs["use_cache"] = False
        return self.model(**kwargs)[0]


def export_onnx(model: nn.Module, output: str | Path, *, tokenizer=None, opset: int = 17, tolerance: float = 1e-4,
                signature: dict | None = None) -> dict:
    """Write ``output/model.onnx`` (+ ``export.json`` and the tokenizer) once onnxruntime matches PyTorch.

    Returns the report written to ``export.json``: inputs, outputs, dynamic axes, the check (max
    difference, relative, tolerance), versions. ``output`` must not exist or be an empty directory.
    """
    ort = require("onnxruntime", "ONNX export")
    require("onnx", "ONNX export")
    output = check_output_dir(output)
    model = unwrap(model).eval()
    seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    names = ["input_ids", "attention_mask"] + (["decoder_input_ids"] if seq2seq else [])
    trace = _random_inputs(model, 2, 8, seq2seq, seed=0)
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "output": {0: "batch", 1: "decoder_sequence" if seq2seq else "sequence"}}
    if seq2seq:
        axes["decoder_input_ids"] = {0: "batch", 1: "decoder_sequence"}
    check = _real_inputs(model, tokenizer, seq2seq)
    with atomic_directory(output) as tmp:
        graph = _Graph(model, seq2seq).eval()
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")  # the exporter's tracer warnings are about Python control flow
                torch.onnx.export(graph, tuple(trace[n] for n in names), str(tmp / ONNX_FILE), dynamo=False,
                                  input_names=names, output_names=["output"], dynamic_axes=axes, opset_version=opset)
        except Exception as e:  # the exporter's own errors: one line, typed
            raise ExportError(f"torch.onnx.export failed for {type(model).__name__}: {type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
        session = onnx_session(tmp / ONNX_FILE, ort)
        got = torch.from_numpy(session.run(None, {n: check[n].numpy() for n in names})[0])
        with torch.no_grad():
            want = graph(*(check[n] for n in names)).float()
        scale = float(want.abs().max()) or 1.0
        err = float((got.float() - want).abs().max())
        report = {"format": "onnx", "file": ONNX_FILE, "model_class": type(model).__name__, "inputs": names,
                  "outputs": ["output"], "dynamic_axes": {k: {str(a): v for a, v in d.items()} for k, d in axes.items()},
                  "cache": False, "opset": opset,
                  "check": {"inputs": "English sentences, tokenized and padded" if tokenizer is not None
                            else "random token ids, padded", "shape": list(check["input_ids"].shape),
                            "max_abs_diff": err, "relative": err / scale, "tolerance": tolerance,
                            "onnxruntime": ort.__version__},
                  "signature": portable(signature or {}), "versions": versions()}
        if not err <= tolerance * scale:
            raise ExportError(f"onnxruntime differs from PyTorch by {err:.3g} ({err / scale:.2g} of the largest "
                              f"output; allowed: {tolerance:g}): the export is not kept")
        (tmp / "export.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return report


def onnx_session(path: str | Path, ort=None):
    """An onnxruntime CPU session of ``path`` (threads: onnxruntime's choice)."""
    ort = ort or require("onnxruntime", "running an ONNX model")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def time_onnx(session, inputs: dict[str, torch.Tensor], *, repeats: int = 5, warmup: int = 1) -> dict:
    """Median (and quartiles of) seconds of one ``session.run`` on ``inputs`` over ``repeats`` rounds."""
    feed = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
    for _ in range(warmup):
        session.run(None, feed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    q = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [times[0]] * 3
    return {"latency_s": statistics.median(times), "latency_s_q25": q[0], "latency_s_q75": q[2], "seconds": times}


def _random_inputs(model: nn.Module, batch: int, length: int, seq2seq: bool, seed: int) -> dict[str, torch.Tensor]:
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3 if vocab > 3 else 0, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:  # the last example padded (left for decoder-only models, as generate pads)
        pad = slice(0, 2) if not seq2seq and _causal(model) else slice(length - 2, length)
        mask[-1, pad] = 0
    out = {"input_ids": ids, "attention_mask": mask}
    if seq2seq:
        out["decoder_input_ids"] = torch.randint(3, vocab, (batch, max(2, length // 2)), generator=g)
    return out


def _real_inputs(model: nn.Module, tokenizer, seq2seq: bool) -> dict[str, torch.Tensor]:
    if tokenizer is None:
        return _random_inputs(model, 3, 13, seq2seq, seed=1)
    tokenizer = copy.deepcopy(tokenizer)  # padding settings for the check only
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if _causal(model) and not seq2seq:
        tokenizer.padding_side = "left"
    x = tokenizer(SENTENCES[:3], padding=True, truncation=True, max_length=32, return_tensors="pt")
    out = {"input_ids": x["input_ids"], "attention_mask": x["attention_mask"]}
    if seq2seq:
        y = tokenizer(SENTENCES[3:], padding=True, return_tensors="pt")["input_ids"]
        out["decoder_input_ids"] = y.repeat(out["input_ids"].shape[0], 1)
    return out


def _causal(model: nn.Module) -> bool:
    return bool(hasattr(model, "generate") and model.can_generate()) and not model.config.is_encoder_decoder


def bench_onnx(models: dict[str, nn.Module], *, batch_sizes=(1, 4), seq_len: int = 128, tgt_len: int | None = None,
               repeats: int = 5, seed: int = 0, reference: dict[str, str] | None = None) -> dict:
    """Each model exported (checked, into a temporary directory) and timed with onnxruntime on the inputs the
    forward benchmark uses; rounds alternate the models. Returns {"models": {name: {batch: timing}},
    "speedups": [{model, reference, batch, measured (median paired ratio)}]}."""
    import tempfile

    from ..core.model.inputs import example_inputs

    ort = require("onnxruntime", "bench --onnx")
    sessions, out = {}, {"models": {}, "speedups": [], "onnxruntime": ort.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, model) in enumerate(models.items()):
            export_onnx(model, Path(tmp) / str(i))
            sessions[name] = onnx_session(Path(tmp) / str(i) / ONNX_FILE, ort)
        names = list(models)
        times: dict[tuple[str, int], list[float]] = {}
        for b in batch_sizes:
            feeds = {n: example_inputs(models[n], b, seq_len, tgt_len=tgt_len, seed=seed) for n in names}
            for n in names:
                time_onnx(sessions[n], feeds[n], repeats=1, warmup=1)  # warm-up
                times[(n, b)] = []
            for r in range(repeats):
                for n in (names if r % 2 == 0 else names[::-1]):
                    times[(n, b)].append(time_onnx(sessions[n], feeds[n], repeats=1, warmup=0)["latency_s"])
            for n in names:
                med = statistics.median(times[(n, b)])
                out["models"].setdefault(n, {})[str(b)] = {"latency_s": med, "examples_per_s": b / med,
                                                           "seconds": times[(n, b)]}
    for name, ref in (reference or {}).items():
        for b in batch_sizes:
            paired = [a / c for a, c in zip(times[(ref, b)], times[(name, b)], strict=True)]
            out["speedups"].append({"model": name, "reference": ref, "batch": b, "measured": statistics.median(paired)})
    return out


def onnx_table(result: dict) -> str:
    """Plain-text table of :func:`bench_onnx`: examples/s with onnxruntime, speed-up over the reference."""
    ups = {(u["model"], u["batch"]): u["measured"] for u in result["speedups"]}
    lines = [f"onnxruntime {result['onnxruntime']}", f"{'model':<22} {'batch':>5} {'examples/s':>11} {'speed-up':>9}"]
    for name, per in result["models"].items():
        for b, r in per.items():
            up = ups.get((name, int(b)))
            lines.append(f"{name:<22} {b:>5} {r['examples_per_s']:>11.2f} "
                         f"{(f'{up:.3f}x' if up is not None else '-'):>9}")
    return "\n".join(lines)
