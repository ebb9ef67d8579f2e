"""Speed (issue 5): FLOPs from shapes, the benchmark and its CLI, the benchmark scripts, and surgery
that pays (no leftover work after pruning; pruned models compile and run in bf16)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

import headprune as hp
from headprune.bench import BenchSettings, benchmark, fraction_plan
from headprune.cli import app
from headprune.core.model.cost import flop_breakdown, flops_per_example
from headprune.core.model.inputs import example_inputs
from headprune.core.model.runtime import RepeatHeads
from tiny import build, inputs

ROOT = Path(__file__).resolve().parents[1]
MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
PNG = b"\x89PNG\r\n\x1a\n"


def bert_macs(t: int, heads=(4, 4), hidden=32, head_dim=8, ffn=37, labels=3) -> int:
    """Tiny BERT by hand: per layer q/k/v/o (4 T d h*hd), QK^T + AV (2 h hd T^2), FFN (2 T d ffn);
    the pooler and the classifier see the [CLS] token only."""
    layer = lambda h: 4 * t * hidden * h * head_dim + 2 * h * head_dim * t * t + 2 * t * hidden * ffn  # noqa: E731
    return sum(layer(h) for h in heads) + hidden * hidden + hidden * labels


# ---------------------------------------------------------------- FLOPs

def test_flops_of_a_tiny_bert_equal_a_hand_computation():
    model = build("bert")
    assert flops_per_example(model, 7, kind="macs") == bert_macs(7)
    assert flops_per_example(model, 7) == 2 * bert_macs(7)
    assert flop_breakdown(model, 7, kind="macs") == {
        "projections": 2 * 4 * 7 * 32 * 32, "attention": 2 * 2 * 4 * 8 * 7 * 7,
        "other": 2 * 2 * 7 * 32 * 37 + 32 * 32 + 32 * 3, "total": bert_macs(7)}


def test_pruned_flops_drop_by_exactly_the_removed_heads():
    model = build("bert")
    hp.prune_heads(model, {"encoder.0.self": [1, 3], "encoder.1.self": [0, 1, 2, 3]})  # site 1 removed
    assert flops_per_example(model, 7, kind="macs") == bert_macs(7, heads=(2, 0))
    with hp.masked(model, {"encoder.0.self": torch.tensor([1.0, 0.0])}):  # masking removes no work
        assert flops_per_example(model, 7, kind="macs") == bert_macs(7, heads=(2, 0))


@pytest.mark.parametrize("family, plan", [
    ("bert", {"encoder.0.self": [0], "encoder.1.self": [0, 1, 2, 3]}),
    ("gpt2", {"decoder.1.self": [1, 2]}),
    ("llama", {"decoder.0.self": [0, 3], "decoder.1.self": [1, 2, 4]}),  # even, then uneven GQA
    ("bart", {"encoder.0.self": [2], "decoder.1.cross": [0, 1, 2, 3]}),
    ("t5", {"decoder.0.cross": [1], "encoder.1.self": [0, 3]}),
])
def test_flops_agree_with_torch_flop_counter(family, plan):
    """An independent count: torch's FlopCounterMode over the same (eager) forward."""
    model = build(family)
    hp.prune_heads(model, plan)
    x = example_inputs(model, 1, 9, tgt_len=5)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(**x)
    assert flops_per_example(model, 9, tgt_len=5) == counter.get_total_flops()


def test_flops_refuse_bad_arguments():
    model = build("bert")
    with pytest.raises(hp.ConfigError, match="kind='gflops'; allowed: flops, macs"):
        flops_per_example(model, 8, kind="gflops")
    with pytest.raises(hp.ConfigError, match="seq_len=100.*max_position_embeddings=64"):
        flops_per_example(model, 100)
    with pytest.raises(hp.ConfigError, match="seq_len=0"):
        flops_per_example(model, 0)


def test_fraction_plan_even_and_random():
    model = build("bert")
    assert fraction_plan(model, 0.5) == {"encoder.0.self": [0, 1], "encoder.1.self": [0, 1]}
    random = fraction_plan(model, 0.5, order="random", seed=3)
    assert sum(map(len, random.values())) == 4 and random == fraction_plan(model, 0.5, order="random", seed=3)
    with pytest.raises(hp.ConfigError, match="order='worst'"):
        fraction_plan(model, 0.5, order="worst")


# ---------------------------------------------------------------- benchmark() and the CLI

def test_benchmark_returns_well_formed_results():
    original = build("bert", attn="sdpa")
    pruned = copy.deepcopy(original)
    hp.prune_heads(pruned, fraction_plan(pruned, 0.5))
    order: list[str] = []
    handles = [m.register_forward_pre_hook(lambda *_, n=n: order.append(n)) for n, m in (("a", original), ("b", pruned))]
    result = benchmark({"a": original, "b": pruned},
                       BenchSettings(batch_sizes=(1, 2), seq_len=8, warmup=1, repeats=3, min_repeat_s=0.0))
    for h in handles:
        h.remove()
    assert order[-6:] == ["a", "b", "b", "a", "a", "b"]  # alternated rounds of the last batch size
    data = json.loads(json.dumps(result.to_dict()))
    assert set(data) >= {"settings", "machine", "versions", "models", "runs", "speedups", "seconds"}
    assert data["machine"]["cpu_count"] == os.cpu_count() and data["machine"]["torch_threads"] >= 1
    assert {"torch", "transformers", "headprune", "python"} <= set(data["versions"])
    assert data["models"]["a"]["heads"] == 8 and data["models"]["b"]["heads"] == 4
    assert data["models"]["b"]["params"] < data["models"]["a"]["params"]
    assert [(r["model"], r["batch"]) for r in data["runs"]] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    for r in data["runs"]:
        assert len(r["seconds"]) == 3 and r["latency_s_q25"] <= r["latency_s"] <= r["latency_s_q75"]
        assert r["examples_per_s"] == pytest.approx(r["batch"] / r["latency_s"])
        assert r["peak_rss_delta_bytes"] is None or r["peak_rss_delta_bytes"] >= 0
    limit = data["models"]["a"]["flops_per_example"] / data["models"]["b"]["flops_per_example"]
    for s in data["speedups"]:
        assert (s["model"], s["reference"]) == ("b", "a") and s["flop_limit"] == pytest.approx(limit) and limit > 1
        assert s["measured"] > 0 and s["efficiency"] == pytest.approx((s["measured"] - 1) / (limit - 1))
    assert "FLOP limit" in result.table()


def test_benchmark_blocked_order_and_bad_settings():
    a, b = build("bert"), build("bert", seed=1)
    order: list[str] = []
    handles = [m.register_forward_pre_hook(lambda *_, n=n: order.append(n)) for n, m in (("a", a), ("b", b))]
    benchmark({"a": a, "b": b}, BenchSettings(batch_sizes=[2], seq_len=4, warmup=0, repeats=2, alternate=False,
                                              memory=False, min_repeat_s=0.0))
    for h in handles:
        h.remove()
    assert order[-4:] == ["a", "a", "b", "b"]
    with pytest.raises(hp.ConfigError, match="repeats for batch size 4=None"):
        benchmark({"a": a}, BenchSettings(batch_sizes=[1, 4], repeats={1: 3}))
    with pytest.raises(hp.ConfigError, match="batch_sizes"):
        benchmark({"a": a}, BenchSettings(batch_sizes=[0]))
    with pytest.raises(hp.ConfigError, match="reference='c'"):
        benchmark({"a": a, "b": b}, BenchSettings(batch_sizes=[1]), reference="c")


def test_cli_bench_writes_json_and_png(tmp_path):
    hp.save_pruned(build("bert"), tmp_path / "bert")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", str(tmp_path / "bert"), "--batch-sizes", "1,2", "--seq-len", "8",
                                      "--repeats", "2", "--warmup", "0", "--min-repeat-s", "0",
                                      "--prune-fraction", "0.5", "--masked", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "FLOP limit" in result.output and "bert-pruned0.5" in result.output
    data = json.loads((out / "bench.json").read_text())
    assert list(data["models"]) == ["bert", "bert-pruned0.5", "bert-masked0.5"]
    assert data["models"]["bert-masked0.5"]["masked"] and data["models"]["bert-pruned0.5"]["heads"] == 4
    ups = {(s["model"], s["batch"]): s for s in data["speedups"]}
    assert ups[("bert-pruned0.5", 2)]["flop_limit"] > 1 and ups[("bert-masked0.5", 2)]["efficiency"] is None
    assert data["extra"]["dropped"]["bert"] == {"encoder.0.self": [0, 1], "encoder.1.self": [0, 1]}
    assert (out / "bench.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "1,x"], "--batch-sizes '1,x'"),
    (["--prune-fraction", "1.5"], "--prune-fraction 1.5"),
    (["--masked"], "--masked needs --prune-fraction"),
    (["--repeats", "0"], "repeats for batch size 1=0"),
])
def test_cli_bench_refuses_bad_input(tmp_path, args, message):
    hp.save_pruned(build("bert"), tmp_path / "bert")
    result = CliRunner().invoke(app, ["bench", str(tmp_path / "bert"), *args, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "out").exists()


def test_benchmark_scripts_run_quick_and_write_json(tmp_path):
    """Each script runs as ``__main__`` with ``--quick``; one interpreter for both (imports dominate)."""
    keys = {"name", "command", "machine", "versions", "settings", "goal", "goal_met"}
    scripts = {"pruned_speed": {"per_batch", "plans", "models"}, "importance_cost": {"ratio", "seconds"}}
    runs = [[str(ROOT / "benchmarks" / f"{name}.py"), "--quick", "--threads", "1", "--output",
             str(tmp_path / f"{name}.json")] for name in scripts]
    code = ("import runpy, sys\n"
            f"for argv in {runs!r}:\n"
            "    sys.argv = argv\n"
            "    runpy.run_path(argv[0], run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in scripts:
        data = json.loads((tmp_path / f"{name}.json").read_text())
        assert keys | scripts[name] <= set(data) and data["name"] == name and data["settings"]["quick"]
    speed = json.loads((tmp_path / "pruned_speed.json").read_text())
    assert [row["batch"] for row in speed["per_batch"]] == [1, 4]
    assert speed["per_batch"][0]["even"]["flop_limit"] > 1 and (tmp_path / "pruned_speed.png").is_file()
    assert sum(speed["plans"]["uneven"]["kept_per_layer"]) == sum(speed["plans"]["even"]["kept_per_layer"])
    cost = json.loads((tmp_path / "importance_cost.json").read_text())
    assert cost["ratio"] > 0 and len(cost["seconds"]["importance"]) == cost["settings"]["repeats"]


# ---------------------------------------------------------------- surgery that pays

class OpLog(TorchDispatchMode):
    """Every aten op a forward runs, with its tensor arguments' shapes."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, list[tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func.overloadpacket.__name__, [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))

    def count(self) -> Counter:
        return Counter(name for name, _ in self.ops)

    def attention(self) -> list:
        return [shapes for name, shapes in self.ops if "scaled_dot_product" in name]

    def matmuls(self) -> list:
        return [shapes for name, shapes in self.ops if name in MATMULS]


def op_log(model, x) -> OpLog:
    with torch.no_grad(), OpLog() as log:
        model(**x)
    return log


def test_pruning_leaves_no_hooks_and_no_empty_parameters():
    model = build("bert", attn="sdpa")
    hp.mask_heads(model, {"encoder.0.self": torch.tensor([0.0, 1.0, 1.0, 1.0])})
    hp.unmask_heads(model)
    hp.prune_heads(model, {"encoder.0.self": [1], "encoder.1.self": [0, 1, 2, 3]})
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks
    assert all(p.numel() > 0 for p in model.parameters())
    assert all(min(m.weight.shape) > 0 for m in model.modules() if isinstance(m, nn.Linear))


def test_an_emptied_site_runs_no_attention_and_no_projection():
    model = build("bert", attn="sdpa")
    x = inputs("bert")
    before = op_log(model, x)
    with hp.masked(model, hp.mask_from_heads(model, {"encoder.0.self": [1]})):
        assert op_log(model, x).count()["mul"] > before.count()["mul"]  # the check sees a mask multiply
    hp.prune_heads(model, {"encoder.0.self": [1], "encoder.1.self": [0, 1, 2, 3]})
    after = op_log(model, x)
    assert len(before.attention()) == 2 and len(after.attention()) == 1
    assert after.attention()[0][0][1] == 3  # [B, heads, T, hd]: 3 heads left in layer 0
    assert len(before.matmuls()) == 14 and len(after.matmuls()) == 10  # q, k, v, o of layer 1 gone
    assert all(min(s) > 0 for shapes in after.matmuls() for s in shapes)  # no zero-sized matmul
    assert after.count()["mul"] == before.count()["mul"]  # no mask multiplication left


def test_even_gqa_plan_stays_plain_gqa_with_the_same_ops():
    model = build("llama", attn="sdpa")  # 6 query heads on 2 key/value heads
    x = inputs("llama", pad=False)  # with a padding mask transformers copies k/v per query head (repeat_kv)
    before = op_log(model, x)
    hp.prune_heads(model, {"decoder.0.self": [0, 3], "decoder.1.self": [2, 5]})  # 2 + 2 query heads per kv head
    assert not any(isinstance(m, RepeatHeads) for m in model.modules())
    after = op_log(model, x)
    assert after.count() == before.count()  # the same ops, only smaller
    assert [[s[1] for s in shapes] for shapes in after.attention()] == [[4, 2, 2], [4, 2, 2]]


def test_uneven_gqa_plan_repeats_only_shared_key_value_heads():
    model = build("llama", attn="sdpa")
    x = inputs("llama", pad=False)
    before = op_log(model, x)
    hp.prune_heads(model, {"decoder.1.self": [1, 2, 4]})  # kv 0 keeps 1 query head, kv 1 keeps 2
    attn = model.model.layers[1].self_attn
    for proj in (attn.k_proj, attn.v_proj):
        assert isinstance(proj, RepeatHeads) and proj.index.tolist() == [0, 1, 1]
        assert proj.base.weight.shape[0] == 2 * 8  # weights of the 2 kept kv heads, no copies
    after = op_log(model, x)
    extra = after.count() - before.count()
    assert set(extra) <= {"index_select", "view", "_unsafe_view"} and extra["index_select"] == 2
    assert not before.count() - after.count()
    assert [[s[1] for s in shapes] for shapes in after.attention()] == [[6, 2, 2], [3, 3, 3]]


COMPILE_REASON = ("HEADPRUNE_SKIP_COMPILE=1: torch.compile builds C++ kernels with inductor, "
                  "30-60 s on a busy 2-core machine")


@pytest.mark.skipif(os.environ.get("HEADPRUNE_SKIP_COMPILE") == "1", reason=COMPILE_REASON)
@pytest.mark.parametrize("family, plan", [
    ("bert", {"encoder.0.self": [1, 2], "encoder.1.self": [0, 1, 2, 3]}),  # one site removed
    ("llama", {"decoder.0.self": [0], "decoder.1.self": [1, 2, 4]}),  # uneven GQA: RepeatHeads
])
def test_pruned_models_compile_without_graph_breaks(family, plan):
    torch._dynamo.reset()
    model = build(family, attn="sdpa")
    hp.prune_heads(model, plan)
    x = inputs(family)
    with torch.no_grad():
        want = model(**x).logits
        got = torch.compile(model, fullgraph=True)(**x).logits
    torch._dynamo.reset()
    assert (got - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family, plan", [
    ("bert", {"encoder.0.self": [1, 2], "encoder.1.self": [0, 1, 2, 3]}),
    ("llama", {"decoder.0.self": [0], "decoder.1.self": [1, 2, 4]}),
    ("bart", {"encoder.1.self": [0, 1, 2, 3], "decoder.0.cross": [3]}),
])
def test_pruned_bf16_matches_masked_bf16(family, plan):
    model = build(family, attn="sdpa").to(torch.bfloat16)
    x = inputs(family)
    with torch.no_grad(), hp.masked(model, hp.mask_from_heads(model, plan)):
        want = model(**x).logits.float()
    hp.prune_heads(model, plan)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        got = model(**x).logits.float()
    assert (got - want).abs().max().item() <= 0.02 * want.abs().max().item() + 1e-2
