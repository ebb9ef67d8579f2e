"""Native code in a child process (headprune.isolation; llama.cpp through headprune.export.llamacpp.in_child): a
child killed by a signal gives a one-line NativeCrashError naming the signal and the rebuild command while this
process carries on; a child's result comes back bit for bit; its exception comes back as itself. No llama.cpp
needed: the children here kill themselves the way a build for another CPU does."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from headprune.errors import ConfigError, NativeCrashError
from headprune.export import llamacpp
from headprune.extras import MissingDependencyError
from headprune.isolation import call_in_child
from native_children import die_by, echo, exit_hard, imported, lock, refuse, stubborn, write_then_die


@pytest.mark.parametrize("signum", [signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT])
def test_a_child_killed_by_a_signal_gives_one_line_naming_it_and_the_rebuild_command(signum):
    with pytest.raises(NativeCrashError) as caught:
        llamacpp.in_child("logits of model.gguf", die_by, int(signum))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"llama.cpp (logits of model.gguf) died of {signal.Signals(signum).name} "
                              f"({signal.strsignal(signum)})")
    assert llamacpp.REBUILD in message and "-DGGML_NATIVE=OFF" in message and "allowed:" in message
    assert llamacpp.in_child("echo", echo, np.zeros(1), 0.0)[2] != os.getpid()  # this process goes on


def test_sigill_is_named_as_an_illegal_instruction():
    with pytest.raises(NativeCrashError, match=r"died of SIGILL \(Illegal instruction\)"):
        llamacpp.in_child("quantizing", die_by, int(signal.SIGILL))


def test_a_child_that_exits_without_a_result_is_a_crash_too():
    with pytest.raises(NativeCrashError, match="exited with status 3 without a result") as caught:
        call_in_child(exit_hard, (3,), what="native code", remedy="allowed: nothing")
    assert str(caught.value) == ("native code exited with status 3 without a result in its child process "
                                 "(this process carries on); allowed: nothing")


def test_a_childs_result_comes_back_bit_for_bit():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((7, 301)).astype(np.float32) * 30
    logits[0, :5] = [np.nan, np.inf, -np.inf, -0.0, np.finfo(np.float32).smallest_subnormal]
    number = float(np.float64(rng.standard_normal()) / 3)
    array, got, pid = llamacpp.in_child("echo", echo, logits, number)
    assert pid != os.getpid()  # it ran elsewhere
    assert array.dtype == logits.dtype and array.shape == logits.shape
    assert array.tobytes() == logits.tobytes()
    assert got.hex() == number.hex()


def test_a_childs_exception_comes_back_as_itself_caused_by_its_traceback():
    with pytest.raises(ConfigError) as caught:
        llamacpp.in_child("refusing", refuse, 5)
    assert str(caught.value) == "value=5; allowed: nothing"  # the CLI's one line: the note is not part of it
    cause = str(caught.value.__cause__)
    assert cause.startswith("raised in the child process:") and "in refuse" in cause


def test_the_child_is_a_fresh_interpreter_on_this_sys_path(tmp_path, monkeypatch):
    (tmp_path / "only_here.py").write_text("def answer():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here

    assert call_in_child(only_here.answer, what="x", remedy="y") == 42
    assert imported("only_here") and not call_in_child(imported, ("only_here",), what="x", remedy="y")


def test_a_quantizer_that_dies_leaves_no_file(tmp_path, monkeypatch):
    source, output = tmp_path / "f32.gguf", tmp_path / "q4.gguf"
    source.write_bytes(b"GGUF")
    monkeypatch.setattr(llamacpp, "installed", lambda module, purpose: None)
    monkeypatch.setattr(llamacpp, "_quantize", write_then_die)  # pickled by its own name: the child finds it
    with pytest.raises(NativeCrashError, match="quantizing f32.gguf to Q4_K_M.*SIGILL"):
        llamacpp.quantize_gguf(source, output, "Q4_K_M")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f32.gguf"]


@pytest.mark.skipif(llamacpp.available(), reason="llama-cpp-python installed")
def test_without_llama_cpp_the_extra_is_named_before_any_child(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    for call in (lambda: llamacpp.llama_logits(path, [1, 2]), lambda: llamacpp.llama_nll(path, [[1, 2]]),
                 lambda: llamacpp.quantize_gguf(path, tmp_path / "q.gguf"),
                 lambda: llamacpp.llama_speed(path, n_threads=1),
                 lambda: llamacpp.paired_speed({"a": path, "b": path}, "a")):
        with pytest.raises(MissingDependencyError, match=r"pip install 'headprune\[llamacpp\]'"):
            call()
    assert llamacpp.llama_cpp_version() is None


def test_arguments_are_refused_here_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp, "installed", lambda module, purpose: None)
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="does not exist"):
        llamacpp.llama_logits(tmp_path / "none.gguf", [1])
    with pytest.raises(ConfigError, match=r"n_threads=0; allowed: an integer >= 1"):
        llamacpp.llama_nll(path, [[1, 2]], n_threads=0)
    with pytest.raises(ConfigError, match="1 empty"):
        llamacpp.llama_nll(path, [[1, 2], []])
    with pytest.raises(ConfigError, match=r"rounds=0; allowed: an integer >= 1"):
        llamacpp.paired_speed({"a": path, "b": path}, "a", rounds=0)
    with pytest.raises(ConfigError, match=r"reference='c'; allowed: one of \['a', 'b'\]"):
        llamacpp.paired_speed({"a": path, "b": path}, "c")


def test_what_does_not_pickle_comes_back_as_an_error_not_a_crash():
    with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object"):
        call_in_child(lock, what="x", remedy="y")  # a return value pickle refuses
    with pytest.raises(RuntimeError) as caught:
        call_in_child(stubborn, what="x", remedy="y")  # an exception that does not unpickle
    assert type(caught.value) is RuntimeError and str(caught.value) == "Stubborn: no way back"
