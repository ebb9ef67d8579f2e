"""Is the 50% configuration's pruned model a function of its arithmetic's rounding? (issue #34, item 5)

    python benchmarks/rounding.py            # SmolLM2-135M, 50% of non-embedding params (~6 min)
    python benchmarks/rounding.py --quick    # a tiny random GQA Llama (seconds)

``headprune-fisher+linear-2steps+obs-seq`` as shipped, and three other ways to compute the same quantities:

- ``sites run, not replayed``: the pass handing each block's outputs to the next one runs the attention sites (with
  the removed heads cut out) instead of replaying their output projections on what the moment pass saw;
- ``float32 greedy``: the OBS greedy's weights and inverse-covariance downdates in float32 (the shipped greedy
  works in float64; the inverse is computed in float64 in both);
- ``float32 inverse``: the inverse covariance the greedy starts from, its Cholesky factor and inverse computed in
  float32 (then taken on in float64).

Per variant: the perplexity on the held-out calibration blocks (the same model, batches and blocks as
``benchmarks/llm_peers.py``; the evaluation texts are not read), whether its dropped units and every weight equal
the shipped pass's to the bit, and the pruning seconds (load recorded; the speed protocol is
``benchmarks/prune_time.py``'s). Resumes: variants already in the output are kept. Writes
``benchmarks/results/rounding.json``.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_peers  # noqa: E402
from peers import protocol, results_io  # noqa: E402
from peers.headprune_rows import CONFIGURATIONS, settings_for  # noqa: E402

from headprune import compress  # noqa: E402
from headprune.bench.machine import loadavg  # noqa: E402
from headprune.compression import blockwise  # noqa: E402
from headprune.core.cut import obs  # noqa: E402

OUTPUT = Path(__file__).resolve().parent / "results" / "rounding.json"
SELECTED = "headprune-fisher+linear-2steps+obs-seq"


@contextmanager
def _sites_run():
    """The hand-on pass running every attention site (nothing seen by the moment pass is replayed)."""
    with _patched(blockwise._AttentionReplay, "hooks", lambda self: []):
        yield


@contextmanager
def _float32_greedy():
    real = obs._State.__init__

    def init(self, w, hinv):
        real(self, w.to(torch.float32), hinv.to(torch.float32))

    with _patched(obs._State, "__init__", init):
        yield


@contextmanager
def _float32_inverse():
    def inverse(mean, second, damping):
        h = obs.ridged_covariance(mean, second, damping).to(torch.float32)
        return torch.cholesky_inverse(torch.linalg.cholesky(h)).to(torch.float64)

    with _patched(obs, "_inverse_covariance", inverse):
        yield


@contextmanager
def _patched(owner, name: str, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


VARIANTS = {"shipped": nullcontext, "sites run, not replayed": _sites_run, "float32 greedy": _float32_greedy,
            "float32 inverse": _float32_inverse}


def main(argv=None) -> dict:
    args = llm_peers.held_out_args(__doc__.splitlines()[0], argv)
    model, batches, held, described = llm_peers.held_out_data(args.quick)
    # the configuration's settings too: a change of them runs every row again
    output, out = llm_peers.held_out_study("rounding", args, argv, described, OUTPUT,
                                           {"config": SELECTED, "selected_config": CONFIGURATIONS[SELECTED]},
                                           lambda name: {"variant": name})
    done = {r["method"] for r in out["rows"]}
    if done >= set(VARIANTS):
        return out
    shipped = None  # run first: every variant is compared with it, also when its row is kept
    for name, patch in VARIANTS.items():
        if name in done and name != "shipped":
            continue
        start, load = time.perf_counter(), loadavg()
        with patch():
            result = compress(model, batches, settings_for(SELECTED, model, args.budget))
        seconds = time.perf_counter() - start
        if name == "shipped":
            shipped = result
            if name in done:
                continue
        ppl = protocol.perplexity(protocol.window_nll(result.model, held))
        out["rows"].append({"method": name, "config": {"variant": name}, "held_out_perplexity": ppl,
                            **_same(result, shipped),
                            "prune_seconds": seconds, "loadavg_before": load, "loadavg_after": loadavg()})
        print(f"{name}: held-out perplexity {ppl:.3f}, {seconds:.0f} s", flush=True)
        results_io.save(output, out)
    return out


def _same(result, shipped) -> dict:
    """Whether ``result`` dropped the units ``shipped`` dropped, and how many of its weights differ at all."""
    a, b = result.model.state_dict(), shipped.model.state_dict()
    differ = [k for k in b if k not in a or a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]
    return {"same_units": result.dropped_heads == shipped.dropped_heads
            and result.dropped_neurons == shipped.dropped_neurons,
            "tensors": len(b), "tensors_not_bit_equal": len(differ)}


if __name__ == "__main__":
    main()
