"""llama.cpp itself, through ``llama-cpp-python`` (the ``llamacpp`` extra): its logits on given token ids,
its own quantizer (K-quants the ``gguf`` package cannot write), and its prompt/generation speed.

These run a GGUF file the way users of llama.cpp do, so they are the runtime check of
:func:`headprune.export.gguf.export_gguf` (tests and ``benchmarks/quantized_pruned.py``). Threads are
set explicitly (``n_threads``) for prompt processing and generation alike.

llama.cpp runs in a child process (:func:`in_child`), never in this one: a llama-cpp-python built with native CPU
flags (AVX-512, AMX) dies of SIGILL on a CPU without them, and a signal would kill the whole Python process. Here
it raises :class:`~headprune.errors.NativeCrashError` in one line, naming the signal and :data:`REBUILD`. Arguments
are checked here first, so a wrong one costs no child.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import math
import statistics
import time
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..extras import installed, require
from ..isolation import call_in_child

QUANTS = {"Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q4_K_S": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
          "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}
# llama-cpp-python without the instructions of the machine it was built on (pip builds with GGML_NATIVE=ON)
REBUILD = ('CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF" '
           "pip install --force-reinstall --no-cache-dir llama-cpp-python")


def in_child(what: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` -- code that loads llama.cpp -- in a child process
    (:func:`headprune.isolation.call_in_child`): its result bit for bit, or its exception; a child killed by a
    signal raises :class:`~headprune.errors.NativeCrashError` naming it and the rebuild command."""
    return call_in_child(fn, args, kwargs, what=f"llama.cpp ({what})",
                         remedy=f"allowed: a llama-cpp-python this CPU can run; rebuild it without native CPU "
                                f"flags: {REBUILD}")


def available() -> bool:
    """Whether llama-cpp-python is installed (found, not imported: only child processes load llama.cpp)."""
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp_version() -> str | None:
    """llama-cpp-python's version, from its package metadata (importing it would load llama.cpp here)."""
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _checked(path: str | Path, n_threads: int, purpose: str) -> str:
    installed("llama_cpp", purpose)
    if not Path(path).is_file():
        raise ConfigError(f"GGUF file {str(path)!r} does not exist")
    if not isinstance(n_threads, int) or n_threads < 1:
        raise ConfigError(f"n_threads={n_threads!r}; allowed: an integer >= 1")
    return str(path)


def _llama(path: str, *, n_ctx: int, n_threads: int, logits_all: bool, f32_cache: bool = False):
    """A llama.cpp model: in a child process only (:func:`in_child`)."""
    llama_cpp = require("llama_cpp", "running a GGUF file in llama.cpp")
    cache = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if f32_cache else {}
    return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=n_threads,
                           n_threads_batch=n_threads, logits_all=logits_all, verbose=False, seed=0, **cache)


def llama_logits(path: str | Path, ids: list[int], *, n_threads: int = 1) -> np.ndarray:
    """llama.cpp's logits ``[len(ids), vocab]`` for the token ids ``ids`` (one sequence, from position 0), with
    a float32 key/value cache (llama.cpp's default cache is float16: an extra rounding the check should not mix in)."""
    ids = [int(i) for i in ids]
    if not ids:
        raise ConfigError("ids=[]; allowed: at least one token id")
    path = _checked(path, n_threads, "running a GGUF file in llama.cpp")
    return in_child(f"logits of {Path(path).name}", _logits, path, ids, n_threads)


def _logits(path: str, ids: list[int], n_threads: int) -> np.ndarray:  # [len(ids), vocab]; in the child
    llm = _llama(path, n_ctx=max(32, len(ids)), n_threads=n_threads, logits_all=True, f32_cache=True)
    try:
        llm.reset()
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def llama_nll(path: str | Path, blocks: list[list[int]], *, n_threads: int = 1) -> tuple[float, int]:
    """Summed next-token negative log-likelihood (nats) of each block in llama.cpp, and the tokens scored
    (all blocks in one child process: their logits stay there)."""
    blocks = [[int(i) for i in block] for block in blocks]
    if not blocks or not all(blocks):
        raise ConfigError(f"blocks: {len(blocks)} blocks, {sum(not b for b in blocks)} empty; allowed: at least one "
                          f"block, each with at least one token id")
    path = _checked(path, n_threads, "running a GGUF file in llama.cpp")
    return in_child(f"negative log-likelihood of {Path(path).name}", _nll, path, blocks, n_threads)


def _nll(path: str, blocks: list[list[int]], n_threads: int) -> tuple[float, int]:  # in the child
    total, count = 0.0, 0
    for block in blocks:
        logits = _logits(path, block, n_threads).astype(np.float64)
        lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        targets = np.asarray(block[1:])
        total += float((lse[:-1] - logits[np.arange(len(block) - 1), targets]).sum())
        count += len(block) - 1
    return total, count


def quantize_gguf(source: str | Path, output: str | Path, quant: str = "Q4_K_M", *, n_threads: int = 1) -> Path:
    """llama.cpp's quantizer (what ``llama-quantize`` runs): ``source`` (an f32/f16 GGUF) -> ``output``, written
    whole or not at all (a child that dies leaves no file)."""
    source = _checked(source, n_threads, "llama.cpp quantization")
    if quant not in QUANTS:
        raise ConfigError(f"quant {quant!r}; allowed: {', '.join(QUANTS)}")
    if Path(output).exists():
        raise ConfigError(f"output {str(output)!r} already exists; allowed: a new file")
    tmp = Path(output).with_name(f".{Path(output).name}.tmp")
    try:
        code = in_child(f"quantizing {Path(source).name} to {quant}", _quantize, source, str(tmp), quant, n_threads)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if code != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"llama.cpp could not quantize {source!r} to {quant} (code {code})")
    tmp.rename(output)
    return Path(output)


def _quantize(source: str, output: str, quant: str, n_threads: int) -> int:  # llama.cpp's code; in the child
    llama_cpp = require("llama_cpp", "llama.cpp quantization")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANTS[quant])
    params.nthread = n_threads
    return int(llama_cpp.llama_model_quantize(source.encode(), output.encode(), ctypes.byref(params)))


def llama_speed(path: str | Path, *, n_threads: int, prompt: int = 128, generate: int = 32, repeats: int = 3,
                vocab: int | None = None) -> dict:
    """Tokens per second of llama.cpp on ``path``: prompt processing (``prompt`` tokens in one batch) and
    generation (``generate`` tokens one at a time after it), medians over ``repeats`` runs; llama.cpp's default
    (float16) key/value cache."""
    _counts(prompt=prompt, generate=generate, repeats=repeats)
    path = _checked(path, n_threads, "llama.cpp speed")
    return in_child(f"speed of {Path(path).name}", _speed, path, n_threads, prompt, generate, repeats, vocab)


def _counts(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r}; allowed: an integer >= 1")


def _speed(path: str, n_threads: int, prompt: int, generate: int, repeats: int, vocab: int | None) -> dict:
    llm = _llama(path, n_ctx=prompt + generate + 8, n_threads=n_threads, logits_all=False)
    try:
        n_vocab = vocab or llm.n_vocab()
        rng = np.random.default_rng(0)
        ids = [int(i) for i in rng.integers(3, n_vocab, prompt + generate)]
        pp, tg = [], []
        for r in range(repeats + 1):  # the first round warms up
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(ids[:prompt])
            t1 = time.perf_counter()
            for tok in ids[prompt:]:
                llm.eval([tok])
            t2 = time.perf_counter()
            if r:
                pp.append(prompt / (t1 - t0))
                tg.append(generate / (t2 - t1))
        return {"threads": n_threads, "prompt_tokens": prompt, "generated_tokens": generate,
                "prompt_tokens_per_s": statistics.median(pp), "generate_tokens_per_s": statistics.median(tg),
                "prompt_runs": pp, "generate_runs": tg}
    finally:
        llm.close()


def timed_prompt(llm, ids: list[int]):
    """A workload for :func:`headprune.bench.protocol.paired_rounds`: ``ids`` processed as one batch from an empty
    context; returns its seconds."""
    def run() -> float:
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        return time.perf_counter() - start
    return run


def timed_generate(llm, ids: list[int]):
    """A workload: ``ids[1:]`` fed one token at a time after ``ids[0]`` (outside the clock), as generation does."""
    def run() -> float:
        llm.reset()
        llm.eval(ids[:1])
        start = time.perf_counter()
        for tok in ids[1:]:
            llm.eval([tok])
        return time.perf_counter() - start
    return run


def paired_speed(paths: dict[str, str | Path], reference: str, *, n_threads: int = 1, prompt: int = 128,
                 generate: int = 32, rounds: int = 3) -> dict:
    """Prompt processing (``prompt`` tokens) and generation (``generate`` tokens) of the GGUF files ``paths``
    ({name: file}) in llama.cpp, timed in alternating rounds by the project's speed protocol
    (:func:`headprune.bench.protocol.paired_rounds`: median ratio ``reference`` time / time, its interval, the
    load before and after). Returns ``{"prompt": rounds record, "generate": rounds record}``."""
    _counts(prompt=prompt, generate=generate, rounds=rounds)
    if reference not in paths:
        raise ConfigError(f"reference={reference!r}; allowed: one of {list(paths)}")
    files = {name: _checked(p, n_threads, "llama.cpp speed") for name, p in paths.items()}
    return in_child(f"speed of {', '.join(Path(p).name for p in files.values())}", _paired, files, reference,
                    n_threads, prompt, generate, rounds)


def _paired(files: dict[str, str], reference: str, n_threads: int, prompt: int, generate: int, rounds: int) -> dict:
    from ..bench.protocol import ProtocolSettings, paired_rounds  # in the child

    llms = {name: _llama(p, n_ctx=max(prompt, generate + 1) + 8, n_threads=n_threads, logits_all=False)
            for name, p in files.items()}
    try:
        vocab = min(llm.n_vocab() for llm in llms.values())
        ids = [int(i) for i in np.random.default_rng(0).integers(3, vocab, max(prompt, generate + 1))]
        settings = ProtocolSettings(min_rounds=rounds, max_rounds=rounds, budget_s=0.0, warmup=1, threads=n_threads)
        return {"prompt": paired_rounds({n: timed_prompt(m, ids[:prompt]) for n, m in llms.items()}, reference,
                                        settings),
                "generate": paired_rounds({n: timed_generate(m, ids[: generate + 1]) for n, m in llms.items()},
                                          reference, settings)}
    finally:
        for llm in llms.values():
            llm.close()


def perplexity(nll: float, tokens: int) -> float:
    return math.exp(nll / tokens)
