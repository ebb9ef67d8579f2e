"""The pruning ``Plan`` as data: everything a compression did, stored as ``plan.json`` + ``plan.safetensors`` and
replayed bit for bit on the model it was made on.

A plan holds the heads dropped per site and the FFN neurons dropped (indices among the units the model had), the
sites and FFNs whose output projection gained a bias, and the final value of every tensor a stage rewrote: the
compressed model's tensors that differ from the same model only cut (linear stand-ins, the bias shifts, obs-seq,
the head plan's tuned scales, the least-squares refit, distillation -- whatever a stage wrote, the plan holds its
result, after the cut, at the kept width). It also holds the :func:`~.fingerprint.fingerprint` of the model it was
made on, so :func:`apply_plan` refuses another model, or the same config with other weights, before any change.

:func:`plan_of` makes it from the model before and after: with the unpruned model still at hand it cuts a copy of
it (new modules, its tensors shared: surgery replaces tensors, so only the cut ones are new) and keeps the tensors
that differ; when the model was cut in place (``low_memory``, ``inplace``) it keeps every
tensor whose bytes are not the unpruned model's (the fingerprint's per-tensor hashes), so every tensor surgery
sliced is stored too. Both replay exactly: :func:`apply_plan` gives the biases, cuts the heads, then the neurons,
and sets the stored tensors.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import nn

from ..core.cut.biases import add_zero_biases, added_biases
from ..core.cut.snapshot import shared_copy
from ..core.model.records import ADDED_BIASES_KEY
from ..core.prune import prune_heads, prune_neurons
from ..core.safety.verify import verify_surgery
from ..errors import ConfigError, PlanError, VerificationError
from ..safefiles import read_bytes, write_atomic
from .fingerprint import check_fingerprint, tensor_digest

FORMAT = "headprune-plan/2"


@dataclass
class Plan:
    """What compression removed and rewrote: JSON-ready lists plus the rewritten tensors."""

    dropped_heads: dict[str, list[int]]  # {site: heads removed, indices among the heads it had}
    dropped_neurons: dict[str, list[int]] = field(default_factory=dict)  # {ffn: neurons removed}
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # {state-dict key: value after the cut}
    added_biases: list[str] = field(default_factory=list)  # sites / FFNs whose output projection gained a bias
    fingerprint: dict = field(default_factory=dict)  # of the model it was made on (.fingerprint)
    sizes: dict = field(default_factory=dict)  # before / after: heads, neurons, params, flops, KV bytes per token
    info: dict = field(default_factory=dict)  # how it was made (JSON-ready): settings, stages, a peer's method

    def counts(self) -> dict:
        return {"heads": sum(map(len, self.dropped_heads.values())),
                "neurons": sum(map(len, self.dropped_neurons.values())), "added_biases": len(self.added_biases),
                "tensors": len(self.tensors)}

    def to_dict(self) -> dict:
        """plan.json: everything but the tensors' values (their keys, dtypes and shapes)."""
        return {"format": FORMAT, "dropped_heads": self.dropped_heads, "dropped_neurons": self.dropped_neurons,
                "added_biases": self.added_biases,
                "tensors": {k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
                            for k, v in self.tensors.items()},
                "fingerprint": self.fingerprint, "sizes": self.sizes, "info": self.info}

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (plan.json) and the tensors beside it (same name, ``.safetensors``); returns ``path``."""
        path = Path(path)
        data = save_tensors({k: v.detach().to("cpu").contiguous() for k, v in self.tensors.items()})
        weights = path.with_suffix(".safetensors")
        record = self.to_dict() | {"weights": {"file": weights.name, "sha256": hashlib.sha256(data).hexdigest()}}
        write_atomic(weights, data)
        write_atomic(path, json.dumps(record, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """A plan written by :meth:`save`; anything else is refused in one line naming the file."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"plan {str(path)!r}: {err}; allowed: a plan.json written by headprune compress") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"plan {str(path)!r}: format {data.get('format') if isinstance(data, dict) else None!r}; "
                              f"allowed: {FORMAT!r} (a plan.json written by headprune compress)")
        try:
            weights = path.with_name(data["weights"]["file"])
            raw = read_bytes(weights)
        except (OSError, KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"plan {str(path)!r}: its tensors {str(weights)!r}: {err}; allowed: the "
                              ".safetensors file written beside it") from None
        if hashlib.sha256(raw).hexdigest() != data["weights"]["sha256"]:
            raise PlanError(f"plan {str(path)!r}: {weights.name} is not the file written with it (SHA-256 differs); "
                            "allowed: the pair headprune compress wrote")
        tensors = load_tensors(raw)
        if sorted(tensors) != sorted(data["tensors"]):
            raise PlanError(f"plan {str(path)!r}: {weights.name} holds other tensors than plan.json lists")
        return cls(dropped_heads=data["dropped_heads"], dropped_neurons=data["dropped_neurons"],
                   tensors={k: tensors[k] for k in data["tensors"]}, added_biases=data["added_biases"],
                   fingerprint=data["fingerprint"], sizes=data["sizes"], info=data["info"])


def plan_of(original: nn.Module | None, compressed: nn.Module, dropped_heads: dict, dropped_neurons: dict, *,
            made_on: dict, sizes: dict | None = None, info: dict | None = None) -> Plan:
    """The :class:`Plan` that turns the model ``made_on`` fingerprints (:func:`~.fingerprint.fingerprint`, taken
    before any change) into ``compressed`` by dropping ``dropped_heads`` / ``dropped_neurons`` (original indices).

    ``original``: that model, unchanged (a copy of it sharing its tensors, :func:`~headprune.core.cut.snapshot.
    shared_copy`, is cut to tell which tensors a stage rewrote: only the cut tensors take new memory); None when it
    was cut in place: every tensor whose bytes the fingerprint does not hold under its key is then stored."""
    heads = {k: [int(i) for i in v] for k, v in dropped_heads.items() if len(v)}
    neurons = {k: [int(i) for i in v] for k, v in dropped_neurons.items() if len(v)}
    before = set((made_on.get("config") or {}).get(ADDED_BIASES_KEY) or [])
    plan = Plan(heads, neurons, added_biases=sorted(set(added_biases(compressed)) - before), fingerprint=made_on,
                sizes=sizes or {}, info=info or {})
    final = compressed.state_dict()
    if original is not None:
        reference = cut(shared_copy(original), plan, verify=False).state_dict()  # only the cut tensors are new
        if reference.keys() != final.keys():
            odd = sorted(reference.keys() ^ final.keys())
            raise VerificationError(f"the compressed model's tensors are not those of the plan's cut: {odd[:3]}")
        changed = [k for k, v in final.items() if not _same(reference[k], v)]
        del reference
    else:
        digests = made_on["tensors"]
        changed = [k for k, v in final.items() if digests.get(k) != tensor_digest(k, v)]
    stored: set[tuple] = set()
    for key in changed:
        tensor = final[key]
        shared = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if tensor.data_ptr() and shared in stored:  # tied to a tensor already stored: set with it
            continue
        stored.add(shared)
        plan.tensors[key] = tensor.detach().to("cpu", copy=True)
    return plan


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b.to(a.device))


def cut(model: nn.Module, plan: Plan, *, verify: bool = True) -> nn.Module:
    """The plan's structure on ``model`` in place: the added biases (zero), then the heads, then the neurons cut."""
    add_zero_biases(model, plan.added_biases)  # before the cut, as the stages gave them: a site losing every head
    heads = {k: v for k, v in plan.dropped_heads.items() if v}  # keeps its bias as its output
    neurons = {k: v for k, v in plan.dropped_neurons.items() if v}
    if verify and (heads or neurons):
        verify_surgery(model, ("heads", "neurons") if neurons else ("heads",))
    prune_heads(model, heads, verify=False)
    if neurons:
        prune_neurons(model, neurons, verify=False)
    return model


def apply_plan(model: nn.Module, plan: Plan, *, verify: bool = True) -> nn.Module:
    """Replay ``plan`` on ``model`` in place: refuse a model whose fingerprint is not the plan's (nothing changes),
    give the added biases, cut the heads, then the neurons, and set the tensors the stages rewrote. ``verify=False``
    skips the check that surgery is exact for the model's class."""
    check_fingerprint(model, plan.fingerprint)
    cut(model, plan, verify=verify)
    state = model.state_dict()
    for key, value in plan.tensors.items():
        if key not in state or state[key].shape != value.shape or state[key].dtype != value.dtype:
            found = f"{state[key].dtype} {tuple(state[key].shape)}" if key in state else "no such tensor"
            raise PlanError(f"plan tensor {key!r} is {value.dtype} {tuple(value.shape)}; the cut model has {found}")
    with torch.no_grad():
        for key, value in plan.tensors.items():
            state[key].copy_(value)
    model.eval()
    return model
