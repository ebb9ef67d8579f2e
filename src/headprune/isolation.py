"""Native code in a child process: a crash there becomes a typed error here, not the end of this process.

A llama-cpp-python built with native CPU flags (``-march=native``: AVX-512, AMX) on one machine dies of SIGILL on a
CPU without them, and a signal kills the whole Python process that loaded it, without a message.
:func:`call_in_child` runs ``fn(*args, **kwargs)`` in a fresh interpreter (``python -c``: the native library is
never loaded in this process, and nothing of this process's state, threads or imported modules is inherited) and
hands back its return value -- or the exception it raised -- pickled through a temporary file, so numpy arrays
and floats come back bit for bit. A child killed by a signal, or one that exits without a result, raises
:class:`~headprune.errors.NativeCrashError` with one line naming the signal and the remedy.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import NativeCrashError

# The child applies this process's sys.path before it unpickles the call (which imports fn's module).
CHILD = ("import pickle, sys\n"
         "with open(sys.argv[1], 'rb') as f:\n"
         "    sys.path[:] = pickle.load(f)\n"
         "from headprune.isolation import serve\n"
         "serve(sys.argv[1], sys.argv[2])\n")


def call_in_child(fn: Callable, args: tuple = (), kwargs: dict | None = None, *, what: str, remedy: str) -> Any:
    """``fn(*args, **kwargs)`` in a child interpreter; its return value, or the exception it raised (re-raised here,
    the child's traceback as its cause). ``fn`` and its arguments must pickle (a module-level function).

    Raises :class:`~headprune.errors.NativeCrashError` -- ``"{what} died of SIGILL (Illegal instruction) in its
    child process ...; {remedy}"`` -- when the child dies by a signal or exits without a result."""
    with tempfile.TemporaryDirectory(prefix="headprune-child-") as tmp:
        call, result = Path(tmp) / "call.pickle", Path(tmp) / "result.pickle"
        with open(call, "wb") as f:
            pickle.dump(list(sys.path), f)
            pickle.dump((fn, tuple(args), dict(kwargs or {})), f, protocol=pickle.HIGHEST_PROTOCOL)
        code = subprocess.run([sys.executable, "-c", CHILD, str(call), str(result)], stdin=subprocess.DEVNULL,
                              check=False).returncode
        if code != 0 or not result.is_file():
            raise NativeCrashError(f"{what} {death(code)} in its child process (this process carries on); {remedy}")
        with open(result, "rb") as f:
            ok, value, child_traceback = pickle.load(f)
    if not ok:
        raise value from ChildTraceback(child_traceback)
    return value


class ChildTraceback(Exception):
    """The traceback of an exception raised in the child, as its cause (concurrent.futures' way)."""

    def __str__(self) -> str:
        return f"raised in the child process:\n{self.args[0]}"


def death(code: int) -> str:
    """How a child with exit status ``code`` ended: ``died of SIGILL (Illegal instruction)`` for -4."""
    if code < 0:
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"died of signal {-code}"
        return f"died of {sig.name} ({signal.strsignal(sig)})"
    return f"exited with status {code} without a result" if code else "exited without a result"


def serve(call: str, result: str) -> None:
    """The child's side: run the pickled call in ``call``, write ``(ok, value or exception, traceback)`` to
    ``result`` (complete or not at all: written beside it, then renamed)."""
    try:
        with open(call, "rb") as f:
            pickle.load(f)  # sys.path, applied by CHILD
            fn, args, kwargs = pickle.load(f)
        reply = (True, fn(*args, **kwargs), "")
    except Exception as e:
        reply = (False, portable(e), traceback.format_exc())
    part = f"{result}.part"
    try:
        with open(part, "wb") as f:
            pickle.dump(reply, f, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # a return value that does not pickle
        with open(part, "wb") as f:
            pickle.dump((False, portable(e), traceback.format_exc()), f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(part, result)


def portable(error: Exception) -> Exception:
    """``error`` itself if it survives pickling (headprune's errors do), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
