"""The demo's last step: the original and the pruned model as Q8_0 GGUF files, sizes side by side; a one-line
skip without the gguf package or with a tokenizer the exporter cannot write."""

from __future__ import annotations

import importlib.util
import signal

import pytest

import headprune
from headprune.experiments import demo
from headprune.extras import MissingDependencyError
from llm_tiny import bpe_tokenizer, tiny_decoder

gguf = pytest.importorskip("gguf")


def test_gguf_step_writes_both_files_and_reports_their_sizes(tmp_path, capsys):
    original, tok = tiny_decoder("llama"), bpe_tokenizer()
    pruned = tiny_decoder("llama")
    headprune.prune_heads(pruned, {headprune.find_sites(pruned)[0].name: [0, 1]})  # 2 of 4 heads (32 wide)
    out = demo.gguf_step(original, pruned, tmp_path / "gguf", tokenizer=tok, repeats=1)
    for name in ("original", "pruned"):
        path = tmp_path / "gguf" / f"{name}.q8_0.gguf"
        assert out[name]["bytes"] == path.stat().st_size
        reader = gguf.GGUFReader(str(path))  # independent of the exporter's report
        assert {t.tensor_type.name for t in reader.tensors} == {"Q8_0", "F32"}
    assert out["bytes_ratio"] == pytest.approx(out["pruned"]["bytes"] / out["original"]["bytes"]) and out["bytes_ratio"] < 1
    assert out["pruned"]["wider_than_unpruned"] == [] and out["pruned"]["arch"] == "deci"
    shown = capsys.readouterr().out
    assert "original.q8_0.gguf" in shown and "MiB" in shown
    if importlib.util.find_spec("llama_cpp") is None:
        assert "not installed" in out["llama_cpp"]
    else:
        assert set(out["llama_cpp"]) == {"prompt", "generate"}
    again = demo.gguf_step(original, pruned, tmp_path / "gguf", tokenizer=tok, repeats=1)  # a rerun replaces them
    assert again["pruned"]["bytes"] == out["pruned"]["bytes"]


def test_gguf_step_is_skipped_with_one_line_without_the_package_or_a_writable_tokenizer(tmp_path, monkeypatch, capsys):
    model, chars = demo.tiny_llama()  # the quick demo's character tokenizer: not byte-level BPE
    out = demo.gguf_step(model, model, tmp_path / "a", tokenizer=chars)
    assert "byte-level BPE" in out["skipped"] and not (tmp_path / "a").exists()

    def missing(module, purpose):
        raise MissingDependencyError(f"{purpose} needs the package 'gguf', which is not installed")

    monkeypatch.setattr("headprune.export.gguf.require", missing)
    out = demo.gguf_step(tiny_decoder("llama"), tiny_decoder("llama"), tmp_path / "b", tokenizer=bpe_tokenizer())
    assert "not installed" in out["skipped"] and not (tmp_path / "b").exists()
    lines = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    assert len(lines) == 2


def test_gguf_step_keeps_the_files_when_llama_cpp_dies(tmp_path, monkeypatch, capsys):
    from headprune.export import llamacpp
    from native_children import die_by

    def crashing(*args, **kwargs):  # what a llama-cpp-python built for another CPU does in paired_speed's child
        return llamacpp.in_child("speed of original.q8_0.gguf", die_by, int(signal.SIGILL))

    monkeypatch.setattr(llamacpp, "available", lambda: True)
    monkeypatch.setattr(llamacpp, "paired_speed", crashing)
    model = tiny_decoder("llama")
    out = demo.gguf_step(model, model, tmp_path / "gguf", tokenizer=bpe_tokenizer(), repeats=1)
    assert out["llama_cpp"].startswith("speed not measured: llama.cpp (speed of original.q8_0.gguf) died of SIGILL")
    assert llamacpp.REBUILD in out["llama_cpp"]
    assert all((tmp_path / "gguf" / f"{n}.q8_0.gguf").stat().st_size == out[n]["bytes"] for n in ("original", "pruned"))
    assert [line for line in capsys.readouterr().out.splitlines() if "SIGILL" in line] == [f"      {out['llama_cpp']}"]
