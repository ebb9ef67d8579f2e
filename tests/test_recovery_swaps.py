"""benchmarks/recovery_swaps.py and its LoRA (benchmarks/peers/lora.py): a fresh adapter changes nothing, a merged
adapter gives the logits of the unmerged one and of the weights ``W + (alpha / r) B A`` written by hand; the
quick run (training losses fall, the schema, the recovered share by its definition, resume); the docs block."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import transformers as T

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from peers import lora  # noqa: E402


def llama(seed: int = 0):
    torch.manual_seed(seed)
    config = T.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=40, max_position_embeddings=64, vocab_size=50)
    return T.LlamaForCausalLM(config).eval()


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


X = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(3))


def test_a_fresh_adapter_changes_nothing_and_freezes_the_base():
    model = llama()
    before = logits(model, X)
    params = lora.add_lora(model)
    assert len(params) == 2 * 7 * 2  # A and B on q/k/v/o/gate/up/down of 2 layers
    assert sum(isinstance(m, lora.LoRALinear) for m in model.modules()) == 14
    assert {id(p) for p in model.parameters() if p.requires_grad} == {id(p) for p in params}
    assert torch.equal(logits(model, X), before)


def test_merged_adapter_equals_unmerged_and_the_weights_by_hand():
    model = llama()
    reference = copy.deepcopy(model)
    lora.add_lora(model, rank=8, alpha=16)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, lora.LoRALinear):
                m.lora_b.normal_(0, 0.05)
    unmerged = logits(model, X)
    # the reference: each wrapped weight replaced by W + 2 B A, computed here from the adapters' tensors
    wrapped = {n: m for n, m in model.named_modules() if isinstance(m, lora.LoRALinear)}
    with torch.no_grad():
        for name, m in wrapped.items():
            ref = reference.get_submodule(name)
            ref.weight.copy_(ref.weight + 2.0 * m.lora_b.double().matmul(m.lora_a.double()).float())
    assert not torch.allclose(unmerged, logits(llama(), X), rtol=1e-3, atol=1e-3)  # the adapters do something
    assert lora.merge_lora(model) == 14
    assert not any(isinstance(m, lora.LoRALinear) for m in model.modules())
    merged = logits(model, X)
    scale = unmerged.abs().max()
    assert torch.allclose(merged, unmerged, rtol=1e-5, atol=1e-5 * scale)
    assert torch.allclose(merged, logits(reference, X), rtol=1e-5, atol=1e-5 * scale)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="rank=0"):
        lora.LoRALinear(torch.nn.Linear(4, 4), rank=0)
    with pytest.raises(ValueError, match="targets="):
        lora.add_lora(llama(), targets=("nothing",))


def _bench():
    spec = importlib.util.spec_from_file_location("recovery", ROOT / "benchmarks" / "recovery_swaps.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_quick_run_trains_and_reports_by_the_definitions(tmp_path):
    bench = _bench()
    path = tmp_path / "r.json"
    out = bench.main(["--quick", "--threads", "1", "--output", str(path), "--budgets", "0.2",
                      "--pairs", "headprune-fisher+linear:distill"])  # one pair: its selection is in the file
    assert set(json.loads(path.read_text())["lr_selection"]) == {"distill@0.2"}
    out = bench.main(["--quick", "--threads", "1", "--output", str(path)])
    assert json.loads(path.read_text())["rows"] == json.loads(json.dumps(out["rows"]))
    assert {(r["pruner"], r["recovery"], r["budget"]) for r in out["rows"]} == {
        (a, b, c) for a, b in bench.PAIRS for c in (0.2, 0.5)}
    s = out["settings"]
    assert set(out["lr_selection"]) == {f"{r}@{b}" for r in ("distill", "lora") for b in (0.2, 0.5)}
    for sel in out["lr_selection"].values():
        grid = {float(k): v["held_out_perplexity"] for k, v in sel["grid"].items()}
        assert sel["chosen"] == min(grid, key=grid.get) and sorted(grid) == sorted(s["lr_grid"][sel["recovery"]])
    base = out["unpruned"]["perplexity"]
    for r in out["rows"]:
        assert r["tokens"] == s["train"]["tokens"] == r["steps"] * 2 * 64 and len(r["losses"]) == r["steps"]
        assert r["lr"] == out["lr_selection"][f"{r['recovery']}@{r['budget']}"]["chosen"]
        if r["recovery"] == "lora":  # the language-modelling loss of a random model falls within 4 steps
            assert sum(r["losses"][-2:]) < sum(r["losses"][:2]), r["losses"]
        before = out["pruned"][f"{r['pruner']}@{r['budget']}"]["perplexity"]
        assert r["perplexity_before"] == before
        for w, after in r["perplexity_after"].items():
            share = (before[w] - after) / (before[w] - base[w])
            assert r["recovered_share"][w] == pytest.approx(share, rel=1e-12)
            assert r["recovered_share_per_1k_tokens"][w] == pytest.approx(share * 1000 / r["tokens"], rel=1e-12)
        assert [p["tokens"] for p in r["curve"]] == [0, 128, 256, 512]
        assert r["curve"][-1]["perplexity"] == r["perplexity_after"]
    trained = {(r["pruner"], r["budget"], r["recovery"]): r["trained_params"] for r in out["rows"]}
    assert all(trained[p, b, "lora"] < trained[p, b, "distill"] for p, b, _ in trained)  # adapters only
    again = bench.main(["--quick", "--threads", "1", "--output", str(path)])  # resumes: nothing rerun
    assert again["rows"] == json.loads(json.dumps(out["rows"]))


@pytest.mark.parametrize("recovery", ["distill", "lora"])
def test_training_lowers_its_loss_on_its_batches(recovery):
    """Three passes over four fixed batches: the mean loss over them (KL to the teacher for distill, the
    model's own next-token loss for LoRA) falls; the teacher is untouched; LoRA is merged away."""
    from headprune.compression.distill import kl_to_teacher

    bench = _bench()
    teacher = llama()
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    g = torch.Generator().manual_seed(5)
    blocks = [torch.randint(0, 50, (2, 16), generator=g) for _ in range(4)]
    snapshot = copy.deepcopy(teacher.state_dict())

    def loss(model):
        total = 0.0
        with torch.no_grad():
            for x in blocks:
                batch = {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x}
                total += float(kl_to_teacher(model, teacher, batch) if recovery == "distill"
                               else model(**batch, use_cache=False).loss)
        return total / len(blocks)

    before = loss(student)
    steps = []
    info = bench.train(student, teacher, recovery, blocks * 3, 1e-3 if recovery == "distill" else 1e-2,
                       at=lambda step, seconds: steps.append(step))
    assert steps == list(range(1, 13)) and len(info["losses"]) == 12
    assert loss(student) < 0.95 * before
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in snapshot.items())
    assert not any(isinstance(m, lora.LoRALinear) for m in student.modules())
    assert not any(p.requires_grad for p in student.parameters())


def test_bad_flags_exit_with_a_message():
    bench = _bench()
    with pytest.raises(SystemExit, match="--pairs 'x:y'"):
        bench.main(["--pairs", "x:y"])
    with pytest.raises(SystemExit, match="--steps 0"):
        bench.main(["--steps", "0"])


def test_the_committed_docs_block_is_what_the_committed_results_generate(tmp_path):
    committed = (ROOT / "docs" / "recovery.md").read_text()
    page = tmp_path / "recovery.md"
    page.write_text(committed)
    _bench().main(["--write-docs", str(page)])
    assert page.read_text() == committed, "run: python benchmarks/recovery_swaps.py --write-docs docs/recovery.md"
