"""Typed exceptions: every user error names the argument, the value and what is allowed."""

from __future__ import annotations


class HeadpruneError(Exception):
    """Base class of every error headprune raises on purpose (the CLI turns these into one line)."""


class UnsupportedModelError(HeadpruneError, TypeError):
    """The model has no attention sites headprune knows how to find."""


class SiteError(HeadpruneError, KeyError):
    """A site name that the model does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MaskError(HeadpruneError, ValueError):
    """A head mask of the wrong shape, type or values."""


class PlanError(HeadpruneError, ValueError):
    """A pruning plan that does not fit the model (unknown site, index out of range, other model)."""


class DataError(HeadpruneError, ValueError):
    """Input data that cannot be read or does not fit the task (file, column, label, encoding)."""


class ConfigError(HeadpruneError, ValueError):
    """A setting outside its allowed range."""


class VerificationError(HeadpruneError, RuntimeError):
    """A check of a result failed: e.g. the pruned model does not compute what the masked one did."""


class NativeCrashError(HeadpruneError, RuntimeError):
    """Native code run in a child process (llama.cpp) killed it: a signal (SIGILL from a build for another CPU,
    SIGSEGV, SIGBUS, ...) or an exit without a result. This process carries on (:mod:`headprune.isolation`)."""


class KVCacheWarning(UserWarning):
    """A pruning plan that makes the key/value cache larger than the unpruned model's (uneven GQA)."""


class NonFiniteError(DataError):
    """NaN or inf where a number must be finite: a model's weight, a loss it computed, the scores made of them
    (:mod:`headprune.core.model.finite`)."""
