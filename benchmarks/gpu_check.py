"""The device check (issue 24): on a machine with a CUDA GPU, the CUDA tests and a short end-to-end in bf16.

    make gpu-check                      # installs the project without dependencies, then runs this
    python benchmarks/gpu_check.py      # the packages the machine's image already has; no network needed

Steps, each timed, each recorded even when it fails: (1) the tests that run on CUDA (``pytest -k cuda``:
every test parametrised over the CUDA device); (2) a small Llama built from a config, in bfloat16 on the
GPU: head importance (one mask-gradient pass), pruning a quarter of the heads (one query head per key/value
group) with pruned == masked checked, save_pruned -> load_pruned with equal logits, and a short speed
benchmark of the original against the pruned model. Meant to take well under 8 minutes. Writes one JSON,
``benchmarks/results/gpu_check.json``. Without CUDA it says so, exits 2 and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_check.json"
TEST_LIMIT_S = 300  # the CUDA tests; the end-to-end takes about a minute on one GPU


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", type=Path, default=RESULTS)
    ap.add_argument("--skip-tests", action="store_true", help="only the end-to-end")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__} sees none); nothing was run and "
              f"{args.output} was not written", file=sys.stderr)
        return 2
    start = time.perf_counter()
    steps: dict[str, dict] = {}
    if not args.skip_tests:
        steps["cuda tests"] = _cuda_tests()
    steps.update(_end_to_end())
    import transformers

    import headprune

    result = {
        "ok": all(s["ok"] for s in steps.values()),
        "device": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
        "versions": {"headprune": headprune.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "python": platform.python_version()},
        "command": "python benchmarks/gpu_check.py", "seconds": round(time.perf_counter() - start, 1), "steps": steps}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=1))
    for name, s in steps.items():
        print(f"{'ok  ' if s['ok'] else 'FAIL'} {name} ({s['seconds']} s){'' if s['ok'] else ': ' + s.get('error', '')}")
    return 0 if result["ok"] else 1


def _cuda_tests() -> dict:
    t = time.perf_counter()
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", "-k", "cuda",
                              "tests"],
                             cwd=ROOT, capture_output=True, text=True, timeout=TEST_LIMIT_S)
    except subprocess.TimeoutExpired:
        return {"ok": False, "seconds": round(time.perf_counter() - t, 1), "error": f"over {TEST_LIMIT_S} s"}
    lines = (run.stdout + "\n" + run.stderr).strip().splitlines()
    # pytest's count line ("12 passed, 3 skipped, 1100 deselected in 30.1s"); -q alone keeps it, -qq drops it
    counts = [line for line in lines if re.search(r"\b\d+ (passed|failed|errors?|skipped|deselected)\b", line)]
    tail = counts[-1:] or lines[-1:]
    return {"ok": run.returncode == 0, "seconds": round(time.perf_counter() - t, 1), "summary": tail[0] if tail else "",
            **({} if run.returncode == 0 else {"error": (run.stdout + run.stderr)[-3000:]})}


def _step(steps: dict, name: str, fn):
    t = time.perf_counter()
    try:
        value, detail = fn()
        steps[name] = {"ok": True, "seconds": round(time.perf_counter() - t, 2), **detail}
        return value
    except Exception as e:
        steps[name] = {"ok": False, "seconds": round(time.perf_counter() - t, 2), "error": f"{type(e).__name__}: {e}"[:500],
                       "traceback": traceback.format_exc()[-3000:]}
        return None


def _end_to_end() -> dict[str, dict]:
    import copy

    import transformers as T

    import headprune as hp

    device, dtype = torch.device("cuda"), torch.bfloat16
    steps: dict[str, dict] = {}
    config = T.LlamaConfig(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                           head_dim=64, intermediate_size=1376, vocab_size=8192, max_position_embeddings=512)
    torch.manual_seed(0)
    # built in bfloat16 as from_pretrained builds it (rotary inv_freq stays float32), so a reload is comparable
    model = T.AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(3, config.vocab_size, (8, 128), generator=g),
                "attention_mask": torch.ones(8, 128, dtype=torch.long)} for _ in range(4)]
    x = {k: v[:2].to(device) for k, v in batches[0].items()}

    def importance():
        scores = hp.head_importance(model, batches)
        ok = all(bool(torch.isfinite(s).all()) and float(s.abs().sum()) > 0 for s in scores.values())
        if not ok:
            raise RuntimeError("importance has non-finite or all-zero sites")
        return scores, {"sites": len(scores)}

    scores = _step(steps, "importance (bf16)", importance)

    def prune():
        sites = hp.find_sites(model)
        # the lowest-scored query head of each key/value group: 8 -> 4 heads per layer, the same in every layer
        dropped = {}
        for s in sites:
            per_group = s.num_heads // s.num_kv_heads
            sc = scores[s.name] if scores is not None else torch.arange(s.num_heads, dtype=torch.float32)
            dropped[s.name] = [grp * per_group + int(sc[grp * per_group:(grp + 1) * per_group].argmin())
                               for grp in range(s.num_kv_heads)]
        with torch.no_grad(), hp.masked(model, hp.mask_from_heads(sites, dropped)):
            want = model(**x).logits.float()
        pruned = copy.deepcopy(model)
        hp.prune_heads(pruned, dropped)
        with torch.no_grad():
            got = pruned(**x).logits.float()
        err = float((got - want).abs().max()) / float(want.abs().max())
        if err > 2e-2:  # bfloat16: a relative 8 bits of mantissa, summed over layers
            raise RuntimeError(f"pruned != masked: relative max difference {err:.3g}")
        return (pruned, got), {"relative_max_difference": err, "heads_before": 8 * config.num_hidden_layers,
                               "heads_after": sum(s.num_heads for s in hp.find_sites(pruned))}

    pruned = _step(steps, "prune (bf16, pruned == masked)", prune)

    def save_load():
        p, got = pruned
        with tempfile.TemporaryDirectory() as tmp:
            hp.save_pruned(p, Path(tmp) / "m")
            back = hp.load_pruned(Path(tmp) / "m", device=device, dtype=dtype)
            with torch.no_grad():
                again = back(**x).logits.float()
        err = float((again - got).abs().max()) / float(got.abs().max())
        if err > 1e-3:
            raise RuntimeError(f"reloaded logits differ: relative max difference {err:.3g}")
        return None, {"relative_max_difference": err}

    if pruned is not None:
        _step(steps, "save_pruned -> load_pruned (bf16)", save_load)

    def bench():
        from headprune.bench.settings import BenchSettings
        from headprune.bench.timing import benchmark

        result = benchmark({"original": model, "pruned": pruned[0]},
                           BenchSettings(batch_sizes=(1, 16), seq_len=128, repeats=3, min_repeat_s=0.1))
        ups = {str(s["batch"]): round(s["measured"], 3) for s in result.speedups if s["model"] == "pruned"}
        return None, {"speedup_by_batch": ups, "seconds_inside": round(result.seconds, 1)}

    if pruned is not None:
        _step(steps, "bench (bf16)", bench)
    return steps


if __name__ == "__main__":
    sys.exit(main())
