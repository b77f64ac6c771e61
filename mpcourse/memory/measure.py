"""Training memory measured on the running process, to keep `mpcourse.memory.accounting`'s accounting honest.

`mpcourse.memory.accounting` counts bytes from first principles. This module watches a real forward and
backward pass instead:

- `measure_saved_activations` lists every tensor autograd keeps for backward, each storage once,
  by the op that saved it, its dtype and whether it is an activation or a 16-bit weight copy;
- `measure_peak_memory` reads the peak of one call: CUDA's allocator counter, or on a CPU the
  moment when what can be seen (parameters, gradients, optimizer state, the bytes saved for
  backward) added up to the most;
- `find_largest_batch` searches for the largest batch that still fits, by trying.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from mpcourse.memory.accounting import MB, _choice, _count

__all__ = ["SavedStorage", "SavedActivations", "measure_saved_activations", "PeakMemory",
           "measure_peak_memory", "find_largest_batch"]


@dataclass(frozen=True)
class SavedStorage:
    """One storage autograd keeps for backward, counted once however many ops save it."""
    op: str            # the first op (in execution order) that saved it
    dtype: torch.dtype
    kind: str          # "activation", "weight copy" (a cast of a parameter) or "parameter"
                       # (a parameter or buffer of the model itself)
    nbytes: int


@dataclass(frozen=True, repr=False)
class SavedActivations:
    """What autograd saved for backward during one forward pass.

    Saved parameters and buffers are listed (kind "parameter") but not counted in `total`: the
    model holds them anyway. `total` is the memory kept alive only for backward.
    """
    storages: tuple[SavedStorage, ...]

    def _sum(self, kind: str) -> int:
        return sum(s.nbytes for s in self.storages if s.kind == kind)

    @property
    def activations(self) -> int:
        return self._sum("activation")

    @property
    def weight_copies(self) -> int:
        return self._sum("weight copy")

    @property
    def parameters(self) -> int:
        return self._sum("parameter")

    @property
    def total(self) -> int:
        return self.activations + self.weight_copies

    def by(self, key: str) -> dict[str, int]:
        """Bytes of `total` grouped by "op", "dtype" or "kind", largest first."""
        _choice(key, ("op", "dtype", "kind"), "key")
        groups: dict[str, int] = {}
        for s in self.storages:
            if s.kind != "parameter":
                label = str(getattr(s, key)).removeprefix("torch.")
                groups[label] = groups.get(label, 0) + s.nbytes
        return dict(sorted(groups.items(), key=lambda item: -item[1]))

    def __repr__(self) -> str:
        lines = [f"SavedActivations: {self.total / MB:,.3f} MB kept for backward "
                 f"({self.parameters / MB:,.3f} MB of saved parameters not counted)"]
        for key in ("kind", "dtype", "op"):
            lines.append(f"  by {key}:")
            lines += [f"    {label:<44}{size / MB:>10,.3f} MB" for label, size in self.by(key).items()]
        return "\n".join(lines)


def _op_name(node) -> str:
    """'NativeLayerNormBackward0' -> 'native_layer_norm'."""
    name = re.sub(r"Backward\d*$", "", node.name().split("::")[-1])
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _saved_by_node(node) -> list[torch.Tensor]:
    """The tensors one autograd node holds for backward."""
    values = [getattr(node, attr) for attr in dir(node) if attr.startswith("_saved_")]
    if hasattr(node, "saved_tensors"):  # custom autograd.Function
        values.append(node.saved_tensors)
    tensors = []
    for value in values:
        items = value if isinstance(value, (tuple, list)) else [value]
        tensors += [t for t in items if isinstance(t, torch.Tensor)]
    return tensors


def _graph_nodes(outputs) -> list:
    """Every autograd node reachable from the tensors in `outputs`."""
    stack = [t.grad_fn for t in _tensors_in(outputs) if t.grad_fn is not None]
    seen, nodes = set(), []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        stack += [next_node for next_node, _ in node.next_functions]
    return nodes


def _tensors_in(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors_in(item)]
    return []


_CAST_AND_VIEW_NODES = ("ToCopyBackward", "TBackward", "ViewBackward", "UnsafeViewBackward",
                        "TransposeBackward", "PermuteBackward", "ExpandBackward",
                        "AliasBackward", "CloneBackward")


def _is_parameter_copy(tensor: torch.Tensor, parameters: set[int]) -> bool:
    """Whether `tensor` was made from one parameter by casts and views only (autocast's copies)."""
    node = tensor.grad_fn
    while node is not None and node.name().rstrip("0123456789").endswith(_CAST_AND_VIEW_NODES):
        inputs = [n for n, _ in node.next_functions if n is not None]
        if len(inputs) != 1:
            return False
        node = inputs[0]
    return node is not None and hasattr(node, "variable") and id(node.variable) in parameters


def _storage_key(tensor: torch.Tensor) -> tuple:
    return (tensor.device.type, tensor.device.index, tensor.untyped_storage().data_ptr())


def _model_storages(model: torch.nn.Module) -> set[tuple]:
    """The storages a model holds anyway: its parameters and buffers."""
    return {_storage_key(t) for t in [*model.parameters(), *model.buffers()]}


def measure_saved_activations(model: torch.nn.Module, *inputs,
                              autocast_dtype: torch.dtype | None = None,
                              loss: Callable[[object], torch.Tensor] | None = None
                              ) -> SavedActivations:
    """Run `model(*inputs)` once and account for every tensor autograd saves for backward.

    Counts with `torch.autograd.graph.saved_tensors_hooks`, each storage once (q, k and v slice
    one storage; a tensor saved by two ops costs its bytes once). With `autocast_dtype`
    (torch.float16 or torch.bfloat16) the forward runs under `torch.autocast`, whose per-op
    policy leaves some saved tensors in FP32: see `.by("dtype")` and `.by("op")`.
    `loss`, if given, is applied to the model's output in the same region, as a training step
    does, so what the loss saves is counted too.
    """
    if autocast_dtype is not None and autocast_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"autocast_dtype must be None, torch.float16 or torch.bfloat16, "
                         f"got {autocast_dtype!r}")
    parameters = list(model.parameters())
    device = next((t.device for t in _tensors_in(list(inputs)) + parameters), torch.device("cpu"))
    saved: list[torch.Tensor] = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16,
                           enabled=autocast_dtype is not None):
        outputs = model(*inputs)
        if loss is not None:
            outputs = loss(outputs)

    first_saver: dict[tuple, tuple[int, str]] = {}
    for node in _graph_nodes(outputs):
        order = node._sequence_nr()
        for tensor in _saved_by_node(node):
            key = _storage_key(tensor)
            if key not in first_saver or order < first_saver[key][0]:
                first_saver[key] = (order, _op_name(node))

    parameter_storages = _model_storages(model)
    parameter_ids = {id(p) for p in parameters}
    storages, counted = [], set()
    for tensor in saved:
        key = _storage_key(tensor)
        if key in counted:
            continue
        counted.add(key)
        if key in parameter_storages:
            kind = "parameter"
        elif _is_parameter_copy(tensor, parameter_ids):
            kind = "weight copy"
        else:
            kind = "activation"
        op = first_saver.get(key, (0, "unattributed"))[1]
        storages.append(SavedStorage(op, tensor.dtype, kind, tensor.untyped_storage().nbytes()))
    return SavedActivations(tuple(storages))


@dataclass(frozen=True, repr=False)
class PeakMemory:
    """The peak memory of one call, what it was made of, and what the measurement could not see.

    CPU only: `largest` holds each kind of tensor at its own largest during the call, and
    `timeline` the bytes of each kind after every event watched (a tensor saved or freed for
    backward, a gradient accumulated, an optimizer step), parameters included. The kinds do not
    peak together: gradients appear in backward while the saved tensors are being freed.
    """
    device: str
    peak: int                      # bytes
    parts: dict[str, int] = field(default_factory=dict)
    unseen: str = ""
    largest: dict[str, int] = field(default_factory=dict)
    timeline: tuple[dict[str, int], ...] = ()

    @property
    def mb(self) -> float:
        return self.peak / MB

    def __repr__(self) -> str:
        lines = [f"PeakMemory on {self.device}: {self.mb:,.1f} MB"]
        lines += [f"  {name:<24}{size / MB:>12,.1f} MB" for name, size in self.parts.items()]
        if self.largest:
            lines.append("  each at its own largest during the call: " + ", ".join(
                f"{name} {size / MB:,.1f} MB" for name, size in self.largest.items()))
        if self.unseen:
            lines.append(f"  not seen: {self.unseen}")
        return "\n".join(lines)


class _LiveBytes:
    """Watches one call: the bytes saved for backward, the gradients and the optimizer state,
    and the moment the three together were largest.

    It looks whenever one of them can change: a tensor saved or freed by autograd, a gradient
    accumulated (a post-accumulate-grad hook) and an optimizer step (a step post-hook).
    """

    def __init__(self, model: torch.nn.Module | None, optimizer):
        self.parameters = list(model.parameters()) if model is not None else []
        self.parameter_bytes = _tensor_bytes(self.parameters)
        self.optimizer = optimizer
        self.ignored = _model_storages(model) if model is not None else set()  # counted as parameters
        self.live: dict[tuple, list] = {}  # saved storage -> [bytes, number of saves holding it]
        self.saved = 0
        self.at_peak = {"gradients": 0, "optimizer state": 0, "saved for backward": 0}
        self.largest = dict(self.at_peak)
        self.timeline: list[dict[str, int]] = []

    def now(self) -> dict[str, int]:
        state = [v for s in (self.optimizer.state.values() if self.optimizer is not None else ())
                 for v in s.values() if isinstance(v, torch.Tensor)]
        return {"gradients": _tensor_bytes(p.grad for p in self.parameters if p.grad is not None),
                "optimizer state": _tensor_bytes(state), "saved for backward": self.saved}

    def observe(self, *_):
        now = self.now()
        self.timeline.append({"parameters": self.parameter_bytes, **now})
        self.largest = {kind: max(self.largest[kind], size) for kind, size in now.items()}
        if sum(now.values()) > sum(self.at_peak.values()):
            self.at_peak = now

    def pack(self, tensor):
        holder = _Holder(tensor)
        key = _storage_key(tensor)
        if key in self.ignored:
            return holder
        entry = self.live.setdefault(key, [tensor.untyped_storage().nbytes(), 0])
        if entry[1] == 0:
            self.saved += entry[0]
            self.observe()
        entry[1] += 1
        weakref.finalize(holder, self._release, key)
        return holder

    def _release(self, key):
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.saved -= entry[0]
            del self.live[key]
            self.observe()

    def hooks(self) -> list:
        """Hook handles that make every gradient accumulation and optimizer step observed."""
        handles = [p.register_post_accumulate_grad_hook(self.observe)
                   for p in self.parameters if p.requires_grad]
        if isinstance(self.optimizer, torch.optim.Optimizer):
            handles.append(self.optimizer.register_step_post_hook(self.observe))
        return handles


class _Holder:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


def _tensor_bytes(tensors) -> int:
    storages = {_storage_key(t): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def measure_peak_memory(fn: Callable[[], object], *, model: torch.nn.Module | None = None,
                        optimizer: torch.optim.Optimizer | None = None,
                        device: str | torch.device | None = None) -> PeakMemory:
    """The peak memory of calling `fn()` once, measured where its work runs.

    That place is `device` where given, else the device of `model`'s parameters (or
    `optimizer`'s); a CUDA GPU merely being present says nothing about it (`--device cpu` on a
    GPU machine runs on the CPU), so with none of the three on such a machine it refuses.
    On CUDA: `torch.cuda.max_memory_allocated` after resetting the peak and synchronizing, i.e.
    every tensor the caching allocator handed out, including temporaries.
    Elsewhere there is no allocator counter to read, so it watches what it can see: the
    parameters of `model`, their gradients, the state of `optimizer` and the tensors autograd
    holds for backward, and reports the moment their sum was largest, split into those kinds.
    Gradients freed by `zero_grad` inside `fn` are counted while they lived.
    """
    where = _work_device(device, model, optimizer)
    if where.type == "cuda":
        torch.cuda.synchronize(where)
        torch.cuda.reset_peak_memory_stats(where)
        before = torch.cuda.memory_allocated(where)
        fn()
        torch.cuda.synchronize(where)
        peak = torch.cuda.max_memory_allocated(where)
        return PeakMemory("cuda", peak, {"allocated before the call": before,
                                         "added at the peak": peak - before},
                          "memory reserved by the caching allocator but not allocated, and "
                          "the CUDA context itself")
    watch = _LiveBytes(model, optimizer)
    handles = watch.hooks()
    watch.observe()
    try:
        with torch.autograd.graph.saved_tensors_hooks(watch.pack, lambda holder: holder.tensor):
            fn()
    finally:
        for handle in handles:
            handle.remove()
    watch.observe()
    parts = {"parameters": watch.parameter_bytes, **watch.at_peak}
    return PeakMemory("cpu", sum(parts.values()), parts,
                      "temporaries that live inside one op or between ops (e.g. the logits), "
                      "autocast's weight cache beyond what backward saves, the input batch, "
                      "and allocator overhead; without model= and optimizer= only the saved "
                      "tensors are counted", largest=watch.largest,
                      timeline=tuple(watch.timeline))



def _work_device(device, model: torch.nn.Module | None, optimizer) -> torch.device:
    """Where the measured call's work runs: `device`, else the model's or optimizer's tensors'."""
    if device is not None:
        return torch.device(device)
    tensors = list(model.parameters()) if model is not None else []
    if optimizer is not None:
        tensors += [p for group in optimizer.param_groups for p in group["params"]]
    if tensors:
        return tensors[0].device
    if torch.cuda.is_available():
        raise ValueError("measure_peak_memory cannot tell where fn runs on a machine with a CUDA GPU: "
                         "pass device= (e.g. 'cuda' or 'cpu') or the model= it trains")
    return torch.device("cpu")

def find_largest_batch(fits: Callable[[int], bool], limit: int = 2**16) -> int:
    """The largest batch in 1..limit for which `fits(batch)` is True, assuming fits is monotone.

    Doubles until a batch fails, then bisects: about 2 * log2(answer) calls. Returns 0 if even
    a batch of one does not fit. On a GPU, `fits` runs a step and catches OutOfMemoryError.
    """
    limit = _count(limit, "limit")
    if limit < 1 or not fits(1):
        return 0
    good = 1
    while True:
        trial = min(2 * good, limit)
        if trial == good:
            return good
        if not fits(trial):
            bad = trial
            break
        good = trial
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good
