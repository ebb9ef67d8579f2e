"""Named evaluation texts of ``benchmarks/llm_peers.py`` beyond its default (the WMT21 news sources), and the
verdicts per text (issue #34).

Each text is English of another kind than the news text, read whole from ``/work/shared/data`` and used only
for evaluation: no calibration, selection or setting anywhere in ``benchmarks/`` or the demo reads these files
(checked by ``grep -rn "qnli\\|test_2018_flickr" benchmarks src/headprune/experiments``, which finds only this
module; ``tests/test_peers_texts.py`` repeats that check). One exception, by name: ``llm_peers.py --calib-mix
...,wiki`` calibrates on ``wiki`` (rows in their own file), and refuses ``--texts wiki`` for those rows.

- ``wiki``: encyclopedic prose, the distinct ``sentence`` column of GLUE QNLI dev (Wikipedia paragraphs of
  SQuAD), in file order, one per line.
- ``captions``: image descriptions, Multi30k ``test_2018_flickr.en`` (1,071 captions), one per line.

A row is scored on a text with the same protocols as on the news text (windows of 128 and 2048 tokens and the
first 32 blocks of 256, the first ``--eval-tokens`` tokens), its ratio against the unpruned model on the same
windows, into ``benchmarks/results/llm_peers_texts.json`` (the rows' own file is only read). Verdicts per text
(:func:`text_verdicts`) judge the headprune configuration selected per budget on the held-out calibration blocks
against the best peer scored on that text.
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

from headprune.provenance import file_sha256

from . import protocol

TEXTS = {
    "wiki": ("qnli/dev.tsv", "Wikipedia sentences: the distinct 'sentence' column of GLUE QNLI dev, in file order"),
    "captions": ("multi30k/test_2018_flickr.en.gz", "image captions: Multi30k test_2018_flickr English"),
}


def read(name: str, shared: Path) -> tuple[str, dict]:
    """(the text, its description: file, sha256, what it is) of the named text under ``shared``."""
    if name not in TEXTS:
        raise SystemExit(f"--texts {name!r}; allowed: a comma-separated subset of {', '.join(TEXTS)}")
    rel, what = TEXTS[name]
    path = shared / rel
    if not path.is_file():
        raise SystemExit(f"--texts {name}: {path} not found (set HEADPRUNE_SHARED_DATA)")
    if path.name.endswith(".tsv"):
        with path.open(encoding="utf-8", newline="") as f:
            lines = list(dict.fromkeys(r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)))
    else:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
    return "\n".join(lines), {"file": rel, "sha256": file_sha256(path), "what": what, "lines": len(lines)}


def scores(evaluation: dict, base: dict) -> dict:
    """{"perplexity", "ratio", "ratio_ci95", "nll_sum"} per protocol of one evaluation against the unpruned one."""
    out: dict = {"perplexity": {}, "ratio": {}, "ratio_ci95": {}, "nll_sum": {}}
    for k, v in evaluation.items():
        out["perplexity"][k] = protocol.perplexity(v)
        r, lo, hi = protocol.ratio_interval(base[k], v)
        out["ratio"][k], out["ratio_ci95"][k] = r, [lo, hi]
        out["nll_sum"][k] = v["nll_sum"]
    return out


def verdict(best: dict, peers: list[dict], tokens: list[int], p: str) -> dict:
    """The selected headprune row's scores ``best`` against the peers' (each {"method", "perplexity", "ratio",
    "nll_sum"}) on protocol ``p``: the best peer by perplexity and the paired ratio headprune / best peer."""
    rival = min(peers, key=lambda r: r["perplexity"][p])
    r, lo, hi = protocol.ratio_interval({"nll_sum": rival["nll_sum"][p], "tokens": tokens},
                                        {"nll_sum": best["nll_sum"][p], "tokens": tokens})
    return {"headprune": best["method"], "perplexity": best["perplexity"][p], "ratio": best["ratio"][p],
            "ratio_ci95": best["ratio_ci95"][p], "best_peer": rival["method"],
            "best_peer_perplexity": rival["perplexity"][p], "best_peer_ratio": rival["ratio"][p],
            "lower_than_every_peer": all(best["perplexity"][p] < r["perplexity"][p] for r in peers),
            "interval_below_best_peer": best["ratio_ci95"][p][1] < rival["ratio"][p],
            "peers_compared": sorted(r["method"] for r in peers),
            "ratio_to_best_peer": r, "ratio_to_best_peer_ci95": [lo, hi]}


def text_verdicts(out: dict, extra: dict, configurations) -> dict:
    """{text: {budget: {protocol: verdict}}} from the extra texts' rows ``extra["rows"]`` of the rows in ``out``;
    the headprune configuration judged per budget is ``out["selected"]`` (chosen on the held-out calibration
    blocks, never on a text)."""
    result: dict = {}
    for name, base in extra.get("unpruned", {}).items():
        for budget, chosen in out.get("selected", {}).items():
            rows = [r for r in extra.get("rows", []) if r.get("status") == "ok" and r["text"] == name
                    and str(r["budget"]) == budget]
            best = next((r for r in rows if r["method"] == chosen), None)
            peers = [r for r in rows if r["method"] not in configurations]
            if best is None or not peers:
                continue
            per = result.setdefault(name, {}).setdefault(budget, {})
            for p in best["perplexity"]:
                per[p] = verdict(best, peers, base["evaluation"][p]["tokens"], p)
    return result
