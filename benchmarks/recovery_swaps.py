"""Recovery after pruning, the short study with the swaps (issue #34; ``benchmarks/recovery.py`` until 0.4, when
the recovery curve of issue #49 took that name): how much of the perplexity a pruned model lost comes back with
a short training on calibration text, per thousand tokens of training, on the peer harness's model and data.

    python benchmarks/recovery_swaps.py                        # SmolLM2-135M, 20% and 50%, every pruner x recovery
    python benchmarks/recovery_swaps.py --quick                # a tiny random Llama, seconds
    python benchmarks/recovery_swaps.py --write-docs docs/recovery.md   # the page's table from the committed JSON

Pruners (the harness's, ``benchmarks/llm_peers.py``, the same calibration batches): headprune's selected
configuration ``headprune-fisher+linear`` and LLM-Pruner's plan (Taylor, block-wise). Recoveries:

- ``distill``: every weight trained towards the unpruned model's output distribution, the loss of headprune's
  ``distill`` compensation (``headprune.compression.distill.kl_to_teacher``: KL(teacher || student) of the
  next-token softmax, no labels read);
- ``lora``: LLM-Pruner's recovery, LoRA of rank 8 and alpha 16 on q/k/v/o/gate/up/down (``peers/lora.py``),
  the language-modelling cross-entropy, merged into the weights afterwards.

Every run: the same training blocks in the same order (calibration text only: the pruning's calibration blocks
and blocks after the held-out ones, never the evaluation text, one pass), the same number of AdamW steps with a
learning rate decaying linearly to 0; the learning rate of each recovery is chosen at each budget from a small grid by the
perplexity on the held-out calibration blocks after a short run (never the evaluation text). Evaluation: the harness's protocol (non-overlapping windows of 128 and 2048 tokens of the evaluation
text, here its first ``--eval-tokens``), before, at checkpoints (window 128 only) and after. Rows are written
as they finish; a rerun with the same settings resumes.
"""

from __future__ import annotations

import argparse
import copy
import fcntl
import json
import pickle
import platform
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_peers  # noqa: E402
from peers import protocol, results_io  # noqa: E402
from peers.headprune_rows import headprune_row  # noqa: E402
from peers.llm_pruner import llm_pruner_plan  # noqa: E402
from peers.lora import add_lora, merge_lora  # noqa: E402
from peers.plan import check_llama_like  # noqa: E402
from recorded import command  # noqa: E402

from headprune.bench.machine import loadavg, machine_info  # noqa: E402
from headprune.bench.protocol import load_record  # noqa: E402
from headprune.compression.distill import kl_to_teacher  # noqa: E402
from headprune.compression.replay import apply_plan  # noqa: E402
from headprune.evaluation.lm import LanguageModelling, prefix_token_id  # noqa: E402
from headprune.provenance import versions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA_KEYS = ("model", "model_sha256", "calib", "calib_sha256", "eval", "eval_sha256", "calib_block", "calib_blocks",
             "select_blocks", "eval_tokens", "protocols", "quick")
NOTES = {  # outside the settings a resume compares: words, not choices
    "eval_tokens": "the first --eval-tokens tokens of the evaluation text (the peer table reads 16384; fewer here "
                   "to fit the loaded machine's time)",
    "lr_selection": "per recovery and budget, the grid value with the lowest held-out calibration perplexity after "
                    "--select-steps steps (lr decaying to 0 over them) on its published pairing (headprune + distill, "
                    "LLM-Pruner + LoRA); used for the swapped pairs too",
    "minutes": "training minutes count the optimizer steps only (distill: the teacher's forward included), one "
               "thread; a row whose load record is not reliable is not a speed result"}
OUTPUT = ROOT / "benchmarks" / "results" / "recovery_swaps.json"
PAGE_MARK = ("<!-- recovery-swaps:begin -->", "<!-- recovery-swaps:end -->")
PRUNERS = ("headprune-fisher+linear", "llm-pruner")
BUDGETS = (0.2, 0.5)
RECOVERIES = ("distill", "lora")
# (pruner, recovery) in the order they run: the two methods as published first, then the swaps that separate
# the pruning from the recovery
PAIRS = (("headprune-fisher+linear", "distill"), ("llm-pruner", "lora"),
         ("headprune-fisher+linear", "lora"), ("llm-pruner", "distill"))
LORA = {"rank": 8, "alpha": 16, "targets": "q/k/v/o/gate/up/down", "dropout": 0.0}
# LLM-Pruner (Ma et al. 2023, Table 1): LLaMA-7B, 20% of the parameters removed, WikiText-2 perplexity
ANCHOR = {"paper": "LLM-Pruner (Ma, Fang & Wang, NeurIPS 2023, arXiv 2305.11627), Table 1",
          "model": "LLaMA-7B", "budget": 0.2, "eval": "WikiText-2",
          "unpruned": 12.62, "pruned": 19.09, "recovered": 17.37,
          "recovery": "LoRA (rank 8) on 50k Alpaca-cleaned samples, about 3 hours on one GPU",
          "source_of_numbers": "the paper's Table 1 (pruned and recovered as quoted in issue #34)"}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calib", type=Path, default=llm_peers.SHARED / "wmt21_newstest" / "newstest2021.de-en.ref.A.en")
    p.add_argument("--eval", type=Path, default=llm_peers.SHARED / "wmt21_newstest" / "newstest2021.en-de.src.en")
    p.add_argument("--calib-block", type=int, default=256, help="Tokens per calibration block (pruning and training).")
    p.add_argument("--calib-blocks", type=int, default=32, help="Blocks the pruning reads (the harness's).")
    p.add_argument("--select-blocks", type=int, default=8, help="Held-out blocks after them: the learning rate's choice.")
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="Shares of non-embedding parameters removed.")
    p.add_argument("--pairs", default="all", help="Comma-separated pruner:recovery pairs, or all: "
                   + ", ".join(f"{a}:{b}" for a, b in PAIRS))
    p.add_argument("--steps", type=int, default=8, help="AdamW steps of every recovery run (one pass, no reuse).")
    p.add_argument("--batch", type=int, default=4, help="Blocks per step.")
    p.add_argument("--checkpoints", default="0.25,0.5", help="Shares of the steps after which window 128 is evaluated.")
    p.add_argument("--lr-distill", default="2e-5,1e-4", help="Learning-rate grid of distill.")
    p.add_argument("--lr-lora", default="1e-4,1e-3", help="Learning-rate grid of LoRA.")
    p.add_argument("--select-steps", type=int, default=2, help="Steps of the short runs that choose the learning rate.")
    p.add_argument("--eval-tokens", type=int, default=4096, help="The first N tokens of the evaluation text.")
    p.add_argument("--windows", default="128,2048")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="A tiny random GQA Llama on CPython's docs (seconds).")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--cache", type=Path, default=None, help="Folder to keep the pruned models in (a rerun loads them).")
    p.add_argument("--write-docs", type=Path, default=None, help="Write the page's table from the JSON, exit.")
    args = p.parse_args(argv)
    if args.quick:
        args.calib_block, args.calib_blocks, args.select_blocks = 64, 8, 2
        args.steps, args.batch, args.select_steps, args.eval_tokens = 4, 2, 2, 2048
        args.windows, args.lr_distill, args.lr_lora = "64,256", "1e-5,1e-4", "3e-3,1e-2"
    return args


def _pairs(text: str) -> list[tuple[str, str]]:
    if text == "all":
        return list(PAIRS)
    pairs = [tuple(v.strip().split(":")) for v in text.split(",") if v.strip()]
    if not pairs or any(p not in PAIRS for p in pairs):
        raise SystemExit(f"--pairs {text!r}; allowed: all or a comma-separated subset of "
                         + ", ".join(f"{a}:{b}" for a, b in PAIRS))
    return pairs


def prune(name: str, model, batches, budget: float):
    """(pruned copy, record) by the harness's pruner ``name``."""
    start = time.perf_counter()
    if name == "llm-pruner":
        plan = llm_pruner_plan(model, batches, budget)
        pruned = apply_plan(copy.deepcopy(model), plan)
    else:
        pruned, _ = headprune_row(name, model, batches, budget)
    return pruned, {"prune_seconds": time.perf_counter() - start, "sizes": protocol.sizes(pruned)}


def train(student, teacher, recovery: str, blocks: list[torch.Tensor], lr: float, at=None) -> dict:
    """One recovery run, in place: one AdamW step per ``blocks`` entry ([B, T]), the learning rate decaying
    linearly from ``lr`` to 0; ``at(step, training seconds so far)`` is called after each step (its time is not counted). LoRA adapters
    are merged into the weights at the end. Returns {"losses", "seconds", "trained_params"}."""
    student.eval()
    teacher.eval()
    if recovery == "lora":
        params = add_lora(student, LORA["rank"], LORA["alpha"])
    else:
        params = [p for p in student.parameters() if p.is_floating_point()]
        for p in params:
            p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    losses, seconds = [], 0.0
    for step, x in enumerate(blocks):
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr * (1 - step / len(blocks))
        batch = {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x}
        if recovery == "distill":
            loss = kl_to_teacher(student, teacher, batch)
        else:
            loss = student(**batch, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seconds += time.perf_counter() - start
        losses.append(float(loss.detach()))
        if at is not None:
            at(step + 1, seconds)
    opt.zero_grad(set_to_none=True)
    if recovery == "lora":
        merge_lora(student)
    for p in student.parameters():
        p.requires_grad_(False)
    if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
        raise FloatingPointError(f"{recovery} at lr={lr}: non-finite loss {losses[-1]}")
    return {"losses": losses, "seconds": seconds, "trained_params": sum(p.numel() for p in params)}


def recovered(base: float, pruned: float, after: float) -> float:
    """Share of the lost perplexity that came back: (pruned - after) / (pruned - unpruned)."""
    return (pruned - after) / (pruned - base)


def curve_point(step, tokens, seconds, held, ppl, base_ppl, pruned_ppl) -> dict:
    share = {k: recovered(base_ppl[k], pruned_ppl[k], v) for k, v in ppl.items()}
    return {"step": step, "tokens": tokens, "train_seconds": seconds, "held_out_perplexity": held,
            "perplexity": ppl, "recovered_share": share,
            "recovered_share_per_1k_tokens": {k: v / (tokens / 1000) for k, v in share.items()} if tokens else None}


class Bench:
    """Model, data and the results file of one invocation."""

    def __init__(self, args, argv):
        self.args = args
        model, tok, calib_text, eval_text, described = llm_peers.load(args)
        check_llama_like(model)
        if args.quick:  # larger, uneven weights: peaked outputs, so pruning loses something to recover
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1 + 3 * torch.rand(p.shape, generator=g))
            described["model"] += ", weights scaled by 1 + 3 U(0, 1)"
        self.teacher = model
        calib = LanguageModelling(tok, [calib_text], block_size=args.calib_block, batch_size=4)
        n_train = args.steps * args.batch
        extra = n_train - args.calib_blocks
        need = args.calib_blocks + args.select_blocks + max(extra, 0)
        if len(calib) < need:
            raise SystemExit(f"--calib {args.calib}: {len(calib)} blocks of {args.calib_block} tokens; {need} needed "
                             f"(--steps x --batch = {n_train} training blocks plus {args.select_blocks} held out)")
        self.batches = list(calib.batches(limit=args.calib_blocks))  # the pruning's, as llm_peers.py
        self.held_out = calib.blocks[args.calib_blocks: args.calib_blocks + args.select_blocks]
        end = args.calib_blocks + args.select_blocks
        pool = torch.cat([calib.blocks[: min(n_train, args.calib_blocks)], calib.blocks[end: end + max(extra, 0)]])
        order = list(range(pool.shape[0]))
        random.Random(0).shuffle(order)
        pool = pool[order]
        self.train_blocks = [pool[i: i + args.batch] for i in range(0, n_train, args.batch)]  # [batch, T] per step
        ids = tok(eval_text, add_special_tokens=False)["input_ids"][: args.eval_tokens]
        sizes = llm_peers._numbers(args.windows, "--windows", int, lambda v: v >= 2, "comma-separated window lengths >= 2")
        first = prefix_token_id(tok)  # windows start as the calibration blocks do (issue #47)
        self.sets = {f"window{n}": protocol.windows(ids, n, prefix=first) for n in sizes}
        self.settings = {
            **described, "prefix_token": first, "calib_block": args.calib_block, "calib_blocks": args.calib_blocks,
            "select_blocks": args.select_blocks, "eval_tokens": len(ids),
            "protocols": {k: list(v.shape) for k, v in self.sets.items()},
            "train": {"steps": args.steps, "batch": args.batch, "seq": args.calib_block,
                      "tokens": n_train * args.calib_block, "blocks": f"calibration blocks 0..{min(n_train, args.calib_blocks) - 1}"
                      + (f" and {end}..{end + extra - 1}" if extra > 0 else "") + ", shuffled (seed 0), one pass",
                      "optimizer": "AdamW, weight decay 0, lr linear to 0", "eval_mode": True},
            "checkpoints": llm_peers._numbers(args.checkpoints, "--checkpoints", float, lambda v: 0 < v < 1,
                                    "comma-separated shares in (0, 1)"),
            "lr_grid": {"distill": llm_peers._numbers(args.lr_distill, "--lr-distill", float, lambda v: v > 0, "positive numbers"),
                        "lora": llm_peers._numbers(args.lr_lora, "--lr-lora", float, lambda v: v > 0, "positive numbers")},
            "select_steps": args.select_steps, "lora": LORA, "threads": args.threads, "quick": args.quick, "seed": 0,
            "budget": "share of non-embedding parameters removed"}
        self.output = args.output or (OUTPUT.with_name("recovery_swaps_quick.json") if args.quick else OUTPUT)
        self.out = self._resumed(json.loads(self.output.read_text()) if self.output.is_file() else {})
        given = sys.argv[1:] if argv is None else list(argv)
        self.out.update({"name": "recovery", "command": command(__file__, given),
                         "machine": machine_info() | {"loadavg_at_start": loadavg()},
                         "versions": versions() | {"python": platform.python_version()}, "settings": self.settings,
                         "notes": NOTES, "anchor": ANCHOR})
        self.pruned: dict[str, torch.nn.Module] = {}

    def evaluate(self, model, only=None) -> dict:
        return {k: protocol.window_nll(model, v) for k, v in self.sets.items() if only is None or k in only}

    def held(self, model) -> float:
        return protocol.perplexity(protocol.window_nll(model, self.held_out))

    def _resumed(self, old: dict) -> dict:
        """What an earlier run's file gives this one: everything when the settings are the same; the unpruned and
        pruned evaluations when only the training settings differ (the data and evaluation are the same)."""
        same = json.loads(json.dumps(self.settings))
        if old.get("settings") == same:
            return old
        if old.get("settings") and all(old["settings"].get(k) == same.get(k) for k in DATA_KEYS):
            return {"rows": [], **{k: old[k] for k in ("unpruned", "pruned") if k in old}}
        return {"rows": []}

    def save(self) -> None:
        """Merge into the file on disk (another invocation, e.g. the other budget, may be writing it too)."""
        self.output.parent.mkdir(parents=True, exist_ok=True)
        with open(self.output.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            disk = self._resumed(json.loads(self.output.read_text()) if self.output.is_file() else {})
            mine = {(r["pruner"], r["recovery"], r["budget"]) for r in self.out["rows"]}
            self.out["rows"] += [r for r in disk["rows"] if (r["pruner"], r["recovery"], r["budget"]) not in mine]
            for key in ("pruned", "lr_selection"):
                self.out[key] = disk.get(key, {}) | self.out.get(key, {})
            self.out.setdefault("unpruned", disk.get("unpruned"))
            if self.out["unpruned"] is None:
                del self.out["unpruned"]
            results_io.save(self.output, self.out)

    def unpruned(self) -> dict:
        if "unpruned" not in self.out:
            ev = self.evaluate(self.teacher)
            self.out["unpruned"] = {"perplexity": {k: protocol.perplexity(v) for k, v in ev.items()}, "evaluation": ev,
                                    "held_out_perplexity": self.held(self.teacher), "sizes": protocol.sizes(self.teacher)}
            self.save()
        return self.out["unpruned"]

    def pruned_model(self, pruner: str, budget: float):
        """(a fresh copy of the pruned model, its record), pruned once per invocation."""
        key = f"{pruner}@{budget}"
        cached = self.args.cache / f"{key}.pt" if self.args.cache else None
        if key not in self.pruned and cached is not None and cached.is_file() and key in self.out.get("pruned", {}):
            self.pruned[key] = torch.load(cached, weights_only=False)
        if key not in self.pruned:
            print(f"pruning: {pruner} at {budget:.0%}", flush=True)
            model, rec = prune(pruner, self.teacher, self.batches, budget)
            self.pruned[key] = model
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                try:
                    torch.save(model, cached)
                except (pickle.PicklingError, AttributeError, TypeError) as e:  # e.g. a class surgery made
                    cached.unlink(missing_ok=True)
                    print(f"  not cached ({type(e).__name__}: {e})", flush=True)
            records = self.out.setdefault("pruned", {})
            if key not in records:
                ev = self.evaluate(model)
                base = self.unpruned()["sizes"]["nonembedding_params"]
                records[key] = rec | {"pruner": pruner, "budget": budget, "evaluation": ev,
                                      "perplexity": {k: protocol.perplexity(v) for k, v in ev.items()},
                                      "held_out_perplexity": self.held(model),
                                      "removed_share": 1 - rec["sizes"]["nonembedding_params"] / base}
                self.save()
        return copy.deepcopy(self.pruned[key]), self.out["pruned"][key]

    def choose_lr(self, recovery: str, budget: float) -> float:
        key = f"{recovery}@{budget}"
        if key not in self.out.setdefault("lr_selection", {}):
            pruner = next(a for a, b in PAIRS if b == recovery)
            grid = {}
            for lr in self.settings["lr_grid"][recovery]:
                student, _ = self.pruned_model(pruner, budget)
                info = train(student, self.teacher, recovery, self.train_blocks[: self.args.select_steps], lr)
                grid[str(lr)] = {"held_out_perplexity": self.held(student), "losses": info["losses"],
                                 "train_seconds": info["seconds"]}
                print(f"  lr {lr:g}: held-out perplexity {grid[str(lr)]['held_out_perplexity']:.2f}", flush=True)
            chosen = min(grid, key=lambda k: grid[k]["held_out_perplexity"])
            # self.out["lr_selection"] is looked up again: a save() inside the loop (the first pruning) replaces it
            self.out.setdefault("lr_selection", {})[key] = {
                "recovery": recovery, "pruner": pruner, "budget": budget, "steps": self.args.select_steps,
                "grid": grid, "chosen": float(chosen)}
            self.save()
        return self.out["lr_selection"][key]["chosen"]

    def run(self, pruner: str, recovery: str, budget: float, lr: float) -> dict:
        base = self.unpruned()
        student, before = self.pruned_model(pruner, budget)
        steps, tokens_per_step = len(self.train_blocks), self.args.batch * self.args.calib_block
        marks = sorted({max(1, round(c * steps)) for c in self.settings["checkpoints"]} - {steps})
        curve = [curve_point(0, 0, 0.0, before["held_out_perplexity"], before["perplexity"], base["perplexity"],
                             before["perplexity"])]
        first = next(iter(self.sets))

        def at(step, seconds):
            if step in marks:
                ev = self.evaluate(student, only=(first,))
                curve.append(curve_point(step, step * tokens_per_step, seconds, self.held(student),
                                         {k: protocol.perplexity(v) for k, v in ev.items()}, base["perplexity"],
                                         before["perplexity"]))

        load0, start = loadavg(), time.perf_counter()
        info = train(student, self.teacher, recovery, self.train_blocks, lr, at)
        load1 = loadavg()
        ev = self.evaluate(student)
        ppl = {k: protocol.perplexity(v) for k, v in ev.items()}
        tokens = steps * tokens_per_step
        curve.append(curve_point(steps, tokens, info["seconds"], self.held(student), ppl, base["perplexity"],
                                 before["perplexity"]))
        ratio = {k: protocol.ratio_interval(base["evaluation"][k], v) for k, v in ev.items()}
        return {"pruner": pruner, "recovery": recovery, "budget": budget, "lr": lr, "steps": steps,
                "tokens": tokens, "train_seconds": info["seconds"], "train_minutes": info["seconds"] / 60,
                "wall_seconds_with_checkpoints": time.perf_counter() - start,
                "load": load_record(load0, load1, self.args.threads), "trained_params": info["trained_params"],
                "removed_share": before["removed_share"], "losses": info["losses"],
                "perplexity_before": before["perplexity"], "perplexity_after": ppl,
                "held_out_perplexity_before": before["held_out_perplexity"],
                "held_out_perplexity_after": self.held(student),
                "ratio_after": {k: v[0] for k, v in ratio.items()},
                "ratio_after_ci95": {k: [v[1], v[2]] for k, v in ratio.items()},
                "recovered_share": curve[-1]["recovered_share"],
                "recovered_share_per_1k_tokens": curve[-1]["recovered_share_per_1k_tokens"], "curve": curve}


def main(argv=None) -> dict | None:
    args = parse(argv)
    if args.write_docs:
        data = json.loads(OUTPUT.read_text()) if OUTPUT.is_file() else None
        results_io.replace_block(args.write_docs, PAGE_MARK, docs_block(data) if data else None,
                                 "benchmarks/results/recovery_swaps.json", "python benchmarks/recovery_swaps.py")
        return None
    budgets = llm_peers._numbers(args.budgets, "--budgets", float, lambda v: 0 < v < 1, "comma-separated numbers in (0, 1)")
    pairs = _pairs(args.pairs)
    for flag, value in (("--steps", args.steps), ("--batch", args.batch), ("--select-steps", args.select_steps),
                        ("--calib-blocks", args.calib_blocks), ("--select-blocks", args.select_blocks),
                        ("--eval-tokens", args.eval_tokens), ("--threads", args.threads)):
        if value < 1:
            raise SystemExit(f"{flag} {value}; allowed: an integer >= 1")
    if args.select_steps > args.steps:
        raise SystemExit(f"--select-steps {args.select_steps}; allowed: at most --steps {args.steps}")
    torch.set_num_threads(args.threads)
    bench = Bench(args, argv)
    bench.unpruned()
    for budget in budgets:
        for pruner, recovery in pairs:
            bench.save()  # merges the rows other invocations finished meanwhile
            if (pruner, recovery, budget) in {(r["pruner"], r["recovery"], r["budget"]) for r in bench.out["rows"]}:
                continue
            lr = bench.choose_lr(recovery, budget)
            print(f"{pruner} at {budget:.0%}, then {recovery} (lr {lr:g})", flush=True)
            row = bench.run(pruner, recovery, budget, lr)
            bench.out["rows"].append(row)
            bench.save()
            print("  " + row_line(row), flush=True)
    bench.save()
    print(f"wrote {bench.output}")
    return bench.out


def row_line(row: dict) -> str:
    return ", ".join(f"{k} {row['perplexity_before'][k]:.2f} -> {v:.2f} ({row['recovered_share'][k]:.0%} back)"
                     for k, v in row["perplexity_after"].items()) + f", {row['train_minutes']:.1f} min training"


def docs_block(data: dict) -> str:
    """The page's generated block: settings, the recovery table and the curve, every number from ``data``."""
    s, base = data["settings"], data["unpruned"]
    windows = list(base["perplexity"])
    first = windows[0]
    sel = data.get("lr_selection", {})
    a = data["anchor"]
    lines = [PAGE_MARK[0], "", "!!! note \"Generated\"",
             "    Every number below is read from `benchmarks/results/recovery_swaps.json` by "
             "`python benchmarks/recovery_swaps.py --write-docs docs/recovery.md`; nothing is typed by hand.", "",
             f"Model: {s['model']}. Training: {s['train']['steps']} AdamW steps of {s['train']['batch']} x "
             f"{s['train']['seq']} tokens = {s['train']['tokens']:,} tokens of `{s['calib']}` "
             f"({s['train']['blocks']}), the same blocks in the same order for every run. Evaluation: the first "
             f"{s['eval_tokens']:,} tokens of `{s['eval']}`, " + ", ".join(
                 f"{k} ({v[0]} windows)" for k, v in s["protocols"].items()) + f". Last invocation: `{data['command']}`.",
             "", f"LoRA: rank {s['lora']['rank']}, alpha {s['lora']['alpha']}, on {s['lora']['targets']}, dropout "
             f"{s['lora']['dropout']}, merged after training.", "", "Unpruned perplexity: " + ", ".join(f"{k} {v:.2f}" for k, v in base["perplexity"].items())
             + f"; held-out calibration blocks {base['held_out_perplexity']:.2f}. Pruned, before recovery: "
             + "; ".join(f"{v['pruner']} at {v['budget']:.0%} (removed {v['removed_share']:.1%}, pruned in "
                         f"{v['prune_seconds']:.0f} s): " + ", ".join(f"{k} {x:.2f}" for k, x in v["perplexity"].items())
                         for v in sorted(data.get("pruned", {}).values(), key=lambda v: (v["budget"], v["pruner"])))
             + ".", ""]
    for info in sorted(sel.values(), key=lambda v: (v["budget"], v["recovery"])):
        grid = ", ".join(f"{float(k):g}: {v['held_out_perplexity']:.2f}" for k, v in info["grid"].items())
        lines.append(f"- Learning rate of `{info['recovery']}` at {info['budget']:.0%}: {info['chosen']:g}, chosen on the held-out calibration blocks "
                     f"after {info['steps']} steps of {info['pruner']} at {info['budget']:.0%} (held-out perplexity "
                     f"per lr: {grid}).")
    lines += ["", "| pruner | recovery | budget | removed | lr | tokens | train min | load (other) | "
              + " | ".join(f"{w} before -> after" for w in windows) + " | "
              + " | ".join(f"{w} recovered" for w in windows) + f" | {first} recovered per 1k tokens |",
              "|---|---|---|---|---|---|---|---|" + "---|" * (2 * len(windows)) + "---|"]
    for r in sorted(data["rows"], key=lambda r: (r["budget"], PAIRS.index((r["pruner"], r["recovery"])))):
        load = r["load"]
        mark = "" if load["reliable"] else " (unreliable)"
        lines.append(f"| {r['pruner']} | {r['recovery']} | {r['budget']:.0%} | {r['removed_share']:.1%} | {r['lr']:g} | "
                     f"{r['tokens']:,} | {r['train_minutes']:.1f}{mark} | {load['other_load']:.2f} | "
                     + " | ".join(f"{r['perplexity_before'][w]:.2f} -> {r['perplexity_after'][w]:.2f}" for w in windows)
                     + " | " + " | ".join(f"{r['recovered_share'][w]:.1%}" for w in windows)
                     + f" | {r['recovered_share_per_1k_tokens'][first]:.2%} |")
    lines += ["", f"Curve: share of the lost {first} perplexity recovered after each checkpoint (tokens trained).", "",
              "| pruner | recovery | budget | " + " | ".join(
                  f"{p['tokens']:,} tokens" for p in (data["rows"][0]["curve"][1:] if data["rows"] else [])) + " |",
              "|---|---|---|" + "---|" * (len(data["rows"][0]["curve"]) - 1 if data["rows"] else 0)]
    for r in sorted(data["rows"], key=lambda r: (r["budget"], PAIRS.index((r["pruner"], r["recovery"])))):
        lines.append(f"| {r['pruner']} | {r['recovery']} | {r['budget']:.0%} | " + " | ".join(
            f"{p['recovered_share'][first]:.1%} ({p['recovered_share_per_1k_tokens'][first]:.2%}/1k)"
            for p in r["curve"][1:]) + " |")
    have = {(r["pruner"], r["recovery"], r["budget"]) for r in data["rows"]}
    missing = [f"{p} + {r} at {b:.0%}" for b in BUDGETS for p, r in PAIRS if (p, r, b) not in have]
    if missing:
        lines += ["", "Not measured in the committed file (not run to the end on the shared machine): "
                  + ", ".join(missing) + "."]
    for note in data.get("changed_after_results", []):
        lines += ["", f"Changed after the runs: {note}"]
    lines += ["", f"Anchor: {a['paper']}: {a['model']} at {a['budget']:.0%}, {a['eval']} perplexity {a['unpruned']} "
              f"unpruned, {a['pruned']} pruned, {a['recovered']} after {a['recovery']}: "
              f"{recovered(a['unpruned'], a['pruned'], a['recovered']):.1%} of the lost perplexity back.", "",
              PAGE_MARK[1]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
