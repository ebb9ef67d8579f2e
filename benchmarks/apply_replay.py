"""``headprune apply`` replays a real compression bit for bit, and refuses another model (issue #48).

    python benchmarks/apply_replay.py                 # SmolLM2-135M at 20% and 50%, the peer table's selected configurations
    python benchmarks/apply_replay.py --quick         # a tiny random Llama saved to a folder (seconds)

For each budget, as a user would: ``headprune compress MODEL --task lm ...`` with the configuration the peer table
selects at that budget (``benchmarks/results/llm_peers.json``, ``selected``; its CLI flags), writing the pruned
model and its plan (``plan.json`` + ``plan.safetensors``); then ``headprune apply MODEL plan.json -o OUT`` in a
new process; then every tensor of the two saved models compared with ``torch.equal`` (and their configs) -- no
tolerance. Then the plan on another model: ``headprune apply`` on the model re-saved as a Hugging Face folder must
be refused (non-zero exit, one line, no output folder); and the model loaded as ``apply`` loads it with one weight
moved by one ulp, handed to ``apply_plan`` (what ``apply`` calls), must be refused naming that weight. Results:
``benchmarks/results/apply_replay.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_peers  # noqa: E402
from peers import results_io  # noqa: E402
from peers.headprune_rows import CONFIGURATIONS, settings_for  # noqa: E402
from recorded import command, repo_path  # noqa: E402

from headprune.bench.machine import machine_info  # noqa: E402
from headprune.provenance import versions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "apply_replay.json"
MOVED = "model.layers.0.self_attn.q_proj.weight"  # the weight the other model moves by one ulp
FLAGS = {"units": "--units", "price": "--price", "scores": "--scores", "compensate": "--compensate",
         "damping": "--damping", "steps": "--steps", "step_standin": "--step-standin",
         "step_damping": "--step-damping", "score_batches": "--score-batches"}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    llm_peers.model_and_texts(p)
    p.add_argument("--budgets", default="0.2,0.5", help="Shares of non-embedding parameters removed.")
    p.add_argument("--calib-limit", type=int, default=32, help="Calibration blocks compress reads.")
    p.add_argument("--work", type=Path, default=Path("runs") / "apply_replay")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


def cli_flags(name: str) -> list[str]:
    """The configuration ``name`` as ``headprune compress`` flags."""
    out = []
    for key, value in CONFIGURATIONS[name].items():
        if isinstance(value, list):
            value = ",".join(map(str, value))
        if key == "compensate":
            value = str(value).replace("+", ",")
        out += [FLAGS[key], str(value)]
    return out


def headprune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headprune", *args], capture_output=True, text=True, cwd=ROOT)


def compare(a: Path, b: Path) -> dict:
    """Every tensor and the config of two saved models: equal bit for bit?"""
    from safetensors.torch import load_file

    def weights(folder: Path) -> dict:
        files = sorted(f for f in folder.glob("*.safetensors") if f.name != "plan.safetensors")
        return {k: v for f in files for k, v in load_file(str(f)).items()}

    ta, tb = weights(a), weights(b)
    unequal = sorted(k for k in ta.keys() & tb.keys() if not (ta[k].shape == tb[k].shape and torch.equal(ta[k], tb[k])))
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (a, b))
    return {"tensors": len(ta), "same_names": ta.keys() == tb.keys(), "unequal": unequal,
            "config_equal": ca == cb,
            "bit_for_bit": bool(ta) and ta.keys() == tb.keys() and not unequal and ca == cb}


def scrub(text: str, work: Path) -> str:
    """``text`` with the run folder's absolute path written as recorded paths are (no machine path in results)."""
    return text.replace(str(work.resolve()), repo_path(work.resolve()))


def other_model(model_spec: str, work: Path) -> Path:
    """The model re-saved as a Hugging Face folder (config as ``save_pretrained`` writes it): another model file."""
    other = work / "other-model"
    if (other / "config.json").is_file():
        return other
    model, tok, _ = llm_peers.load_causal_lm(model_spec)
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(other)
    tok.save_pretrained(other)
    return other


def one_ulp(path: Path, plans: list[Path]) -> list[dict]:
    """Per plan: the model loaded as ``headprune apply`` loads it, its weight ``MOVED`` moved by one ulp, handed to
    ``apply_plan`` (what ``headprune apply`` calls): refused, naming that weight and no other?"""
    from headprune.compression.replay import Plan, apply_plan
    from headprune.core.io import load_model
    from headprune.errors import PlanError

    model = load_model(path, dtype=torch.float32)
    with torch.no_grad():
        w = dict(model.named_parameters())[MOVED]
        w.view(-1)[0] = torch.nextafter(w.view(-1)[0], w.new_tensor(math.inf))
    out = []
    for plan in plans:
        try:
            apply_plan(model, Plan.load(plan))
            out.append({"refused": False})
        except PlanError as e:
            named = str(e).split("weights differ at ")[-1].split(";")[0] if "weights differ at " in str(e) else None
            out.append({"refused": True, "message": str(e), "names_only_that_weight": named == MOVED})
    return out


def quick_model(args) -> Path:
    """The harness's tiny model saved under ``--work``, and the CPython docs as ``--calib`` / ``--eval`` files."""
    from headprune.evaluation.data import python_docs_text

    folder = args.work / "quick-model"
    if not (folder / "config.json").is_file():
        model, tok = llm_peers.quick_model()
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    docs = python_docs_text()
    args.calib, args.eval = args.work / "calib.txt", args.work / "eval.txt"
    args.calib.write_text("\n".join(docs[: len(docs) // 2]))
    args.eval.write_text("\n".join(docs[len(docs) // 2:]))
    return folder


def main(argv=None) -> dict:
    args = parse(argv)
    torch.set_num_threads(1)
    budgets = llm_peers._numbers(args.budgets, "--budgets", float, lambda v: 0 < v < 1, "numbers in (0, 1)")
    selected = json.loads((ROOT / "benchmarks" / "results" / "llm_peers.json").read_text())["selected"]
    spec = args.model or llm_peers.DEFAULT_MODEL
    args.work.mkdir(parents=True, exist_ok=True)
    if args.quick:  # the harness's tiny random Llama, saved as a user's folder; pydoc text as the data
        spec = str(quick_model(args))
    model, _, described = llm_peers.load_causal_lm(spec)
    path = described.get("path") or str(llm_peers.model_path(spec))
    other = other_model(spec, args.work)
    out = {"name": "apply_replay", "command": command(__file__, sys.argv[1:] if argv is None else argv),
           "machine": machine_info(), "versions": versions() | {"python": platform.python_version()},
           "model": described, "rows": []}
    for budget in budgets:
        name = selected[f"{budget:g}"] if f"{budget:g}" in selected else selected[str(budget)]
        share = settings_for(name, model, budget).share  # the harness's share of the pool for this budget
        run, applied = args.work / f"compress-{budget:g}", args.work / f"applied-{budget:g}"
        compress = ["compress", path, "--task", "lm", "--data", str(args.eval), "--limit", "8",
                    "--calib-data", str(args.calib), "--calib-limit", str(args.calib_limit), "--share", repr(share),
                    *cli_flags(name), "--no-bench", "--device", "cpu", "-o", str(run)]
        start, compress_s = time.perf_counter(), None  # None: compressed by an earlier invocation (same command)
        if not (run / "plan.json").is_file():
            done = headprune(*compress)
            if done.returncode:
                raise SystemExit(f"compress failed: {done.stderr.strip().splitlines()[-1:]}")
            compress_s = time.perf_counter() - start
        apply = ["apply", path, str(run / "plan.json"), "-o", str(applied)]
        start = time.perf_counter()
        done = headprune(*apply)
        if done.returncode:
            raise SystemExit(f"apply failed: {done.stderr.strip()}")
        apply_s = time.perf_counter() - start
        refused_dir = args.work / f"refused-{budget:g}"
        refused = headprune("apply", str(other), str(run / "plan.json"), "-o", str(refused_dir))
        row = {"budget": budget, "configuration": name, "share_kept": share,
               "compress": "headprune " + shlex.join(repo_path(w) for w in compress),
               "apply": "headprune " + shlex.join(repo_path(w) for w in apply), "compress_seconds": compress_s,
               "apply_seconds": apply_s, "compared": compare(run, applied),
               "other_model": {"what": "the model re-saved as a Hugging Face folder (headprune apply FOLDER)",
                               "exit_code": refused.returncode, "message": [scrub(line, args.work) for line in
                                                                        refused.stderr.strip().splitlines()[-1:]],
                               "output_written": refused_dir.exists()}}
        out["rows"].append(row)
        print(f"{budget:.0%} {name}: bit for bit {row['compared']['bit_for_bit']} over "
              f"{row['compared']['tensors']} tensors; another model: exit {refused.returncode}", flush=True)
    del model
    for row, moved in zip(out["rows"], one_ulp(Path(path), [args.work / f"compress-{b:g}" / "plan.json" for b in budgets]),
                          strict=True):
        row["one_ulp"] = {"what": f"the model as apply loads it, {MOVED} moved by one ulp, to apply_plan"} | moved
    results_io.save(args.output or (OUTPUT.with_name("apply_replay_quick.json") if args.quick else OUTPUT), out)
    return out


if __name__ == "__main__":
    main()
