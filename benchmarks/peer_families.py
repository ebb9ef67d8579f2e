"""Every peer of the LLM harness on a tiny random model of every decoder family the families table calls exact
(issue #47): the method runs through headprune's family-neutral view of attention sites and FFNs and its pruned
model computes what its plan says, or the family is refused in one line and reported as "not run".

    python benchmarks/peer_families.py                       # every exact decoder family, every peer
    python benchmarks/peer_families.py --families llama,phi3 --output /tmp/x.json

Per (family, method): ``ok`` when the plan removes at least 10% of the tiny model's non-embedding parameters and the
pruned model's logits equal those of an independent reference: the unpruned model with the plan's rewritten
weights and biases set and its dropped heads and neurons masked (zeroed inputs of the output / down projections,
:func:`headprune.masked`), not cut; within 1e-4 of the largest logit. ``not run`` with the refusal's one line
otherwise; ``failed`` when a method ran and the two differ (a bug). Writes benchmarks/results/peer_families.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import families  # noqa: E402
import peers.plan  # noqa: E402
from peers.plan import check_llama_like, nonembedding_params  # noqa: E402
from recorded import command  # noqa: E402

import headprune as hp  # noqa: E402
from headprune.compression.replay import apply_plan  # noqa: E402
from headprune.core.masks.masking import neuron_mask_from  # noqa: E402
from headprune.errors import HeadpruneError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "peer_families.json"
BUDGET = 0.2
TOLERANCE = 1e-4  # of the largest |logit|
QUICK = ("llama", "qwen3", "gemma3_text", "phi3", "gpt_neox", "granite")
LAYERS = 6  # the tiny models' layers: LLM-Pruner keeps the first 3 and the last, so it needs more than 4
HEADPRUNE = "headprune-fisher+linear"  # the configuration the SmolLM2 table selects at 10-30%


def decoder_families() -> list[str]:
    """The causal-LM families the committed families table calls exact, installed here, sorted."""
    rows = json.loads(families.RESULTS.read_text())["families"]
    installed = set(families.tiny_configs.model_types())
    return sorted(r["model_type"] for r in rows if r["verdict"] == "exact"
                  and (r["class"] or "").endswith("ForCausalLM") and r["model_type"] in installed)


def peer_plans() -> dict:
    """{method: (plan function, its settings)} of the harness, and headprune's configuration (imported late:
    llm_peers imports the whole harness)."""
    import llm_peers

    return {**{m: (fn, llm_peers.PEER_SETTINGS.get(m, {})) for m, fn in llm_peers.PLANS.items()}, HEADPRUNE: (None, {})}


def calibration(model, seed: int = 0) -> list[dict]:
    """Two batches of 2 x 16 random token ids (no special ids), the labels the inputs."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config().vocab_size
    out = []
    for _ in range(2):
        ids = torch.randint(4, vocab, (2, 16), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return out


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def reference(model, made: dict, ids: torch.Tensor) -> torch.Tensor:
    """What the peer asked for, by masking: its rewritten weights and added biases set on a copy, its dropped units
    masked, nothing cut."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for path, weight in made["weights"].items():
            ref.get_submodule(path).weight.copy_(weight)
        for path, bias in made["biases"].items():
            linear = ref.get_submodule(path)
            if linear.bias is None:
                linear.bias = torch.nn.Parameter(bias.clone().to(linear.weight.dtype))
            else:
                linear.bias.add_(bias.to(linear.bias.dtype))
    with hp.masked(ref, hp.mask_from_heads(ref, made["heads"])), \
            hp.masked_neurons(ref, neuron_mask_from(ref, made["neurons"])):
        return _logits(ref, ids)


def planned(plan_fn, model, batches, settings: dict) -> tuple:
    """(headprune plan, what the peer handed to ``peer_plan``: heads, neurons, biases, weights)."""
    made, original = {}, peers.plan.peer_plan

    def capture(model, method, heads, neurons, *, biases=None, weights=None, info=None):
        made.update(heads=heads, neurons=neurons, biases=biases or {}, weights=weights or {})
        return original(model, method, heads, neurons, biases=biases, weights=weights, info=info)

    users = [m for name, m in sys.modules.items() if (name == "peers" or name.startswith("peers."))
             and getattr(m, "peer_plan", None) is original]  # peers.plan's Ledger and a peer importing it (FLAP)
    for module in users:
        module.peer_plan = capture
    try:
        return plan_fn(model, batches, BUDGET, **settings), made
    finally:
        for module in users:
            module.peer_plan = original


def _line(e: BaseException) -> str:
    """The error's first line, a temporary folder a trial used named as such (no machine path in the results)."""
    line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{type(e).__name__}: " + re.sub(r"/tmp/[^'\"\s]+", "<temporary folder>", line)


def one(model, method: str, plan_fn, settings: dict, batches) -> dict:
    """The row of ``method`` on ``model``: ok / not run / failed, with what was measured."""
    start = time.perf_counter()
    if plan_fn is None:
        return headprune_one(model, method, batches, start)
    try:
        check_llama_like(model)
        plan, made = planned(plan_fn, model, batches, settings)
        pruned = apply_plan(copy.deepcopy(model), plan)
    except (HeadpruneError, ValueError, RuntimeError, NotImplementedError) as e:
        return {"method": method, "status": "not run", "reason": _line(e)[:300]}
    except Exception as e:  # noqa: BLE001  (anything else is a bug of the peer or of headprune: recorded as such)
        return {"method": method, "status": "failed", "reason": _line(e)[:300]}
    ids = batches[0]["input_ids"]
    want, got = reference(model, made, ids), _logits(pruned, ids)
    diff = float((got - want).abs().max())
    scale = float(want.abs().max())
    removed = 1 - nonembedding_params(pruned) / nonembedding_params(model)
    moved = float((got - _logits(model, ids)).abs().max())  # the plan changed the model
    ok = diff <= TOLERANCE * scale and removed >= 0.1 and moved > 0 and bool(torch.isfinite(got).all())
    units = {"heads": sum(map(len, made["heads"].values())), "neurons": sum(map(len, made["neurons"].values())),
             "biases": len(made["biases"]), "weights": len(made["weights"])}
    return {"method": method, "status": "ok" if ok else "failed", "removed_share": round(removed, 4),
            "max_abs_diff": diff, "max_abs_logit": scale, "moved_from_unpruned": moved, "units": units,
            "seconds": round(time.perf_counter() - start, 2)}


def headprune_one(model, method: str, batches, start: float) -> dict:
    """headprune's configuration on ``model``: its replayed plan equals the compressed model (every tensor), and it
    removes at least 10% of the non-embedding parameters; "not run" with compress's one-line refusal otherwise."""
    from peers.headprune_rows import settings_for

    from headprune.compression import compress

    try:
        result = compress(model, batches, settings_for(method, model, BUDGET))
    except (HeadpruneError, ValueError, RuntimeError, NotImplementedError) as e:
        return {"method": method, "status": "not run", "reason": _line(e)[:300]}
    replayed = apply_plan(copy.deepcopy(model), result.plan)
    mine, theirs = result.model.state_dict(), replayed.state_dict()
    same = mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    removed = 1 - nonembedding_params(result.model) / nonembedding_params(model)
    ok = same and removed >= 0.1 and bool(torch.isfinite(_logits(result.model, batches[0]["input_ids"])).all())
    return {"method": method, "status": "ok" if ok else "failed", "removed_share": round(removed, 4),
            "replay_equal": same, "seconds": round(time.perf_counter() - start, 2)}


def survey(model_type: str, plans: dict) -> dict:
    row = {"model_type": model_type, "rows": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            row["class"], _, model = families.build(model_type, build_limit=600.0)
        except Exception as e:  # noqa: BLE001  (the tiny model could not be made here: every method not run, why)
            line = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            reason = f"the tiny model ({LAYERS} layers) could not be built: {type(e).__name__}: {line}"
            return row | {"built": False, "rows": [{"method": m, "status": "not run", "reason": reason} for m in plans]}
        batches = calibration(model)
        for method, (fn, settings) in plans.items():
            torch.manual_seed(0)
            row["rows"].append(one(model, method, fn, settings, batches))
    return row | {"built": True}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default=None, help="Comma-separated model types (default: every exact decoder).")
    p.add_argument("--quick", action="store_true", help=f"Only {', '.join(QUICK)}.")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    every = decoder_families()
    names = list(QUICK) if args.quick else (every if args.families is None else
                                            [n.strip() for n in args.families.split(",") if n.strip()])
    unknown = [n for n in names if n not in every]
    if unknown:
        raise SystemExit(f"--families {','.join(unknown)}: not an exact decoder family installed here; allowed: "
                         + ", ".join(every))
    torch.set_num_threads(1)
    layers, families.tiny_configs.LAYERS = families.tiny_configs.LAYERS, LAYERS  # restored after: a module global
    try:
        plans = peer_plans()
        out = {"name": "peer_families", "command": command(__file__, argv), "budget": BUDGET, "tolerance": TOLERANCE, "layers": LAYERS,
               "methods": list(plans), "transformers": __import__("transformers").__version__, "families": []}
        for name in names:
            out["families"].append(survey(name, plans))
            statuses = [r["status"] for r in out["families"][-1]["rows"]]
            print(f"{name}: " + ", ".join(f"{m} {s}" for m, s in zip(plans, statuses, strict=True)), flush=True)
    finally:
        families.tiny_configs.LAYERS = layers
    target = args.output or RESULTS
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {target}")
    return out


if __name__ == "__main__":
    main()
