"""Counting the bytes a rank hands to each collective (lesson 08)."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CollectiveCounter(TorchDispatchMode):
    """Counts the bytes this rank hands to each collective while the mode is active.

    Every collective, from Python (DDP's hooks, FSDP2) or from DDP's C++ reducer, reaches the
    process group through a `c10d` operator, which a dispatch mode sees with its tensors.
    The payload counted is the tensor this rank contributes: the whole buffer for an
    all-reduce and a reduce-scatter, its own shard for an all-gather.
    """

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = {}
        self.largest_gathered_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("c10d::"):
            kind, payload = _collective_payload(name.removeprefix("c10d::").split(".")[0], args)
            self.bytes[kind] = self.bytes.get(kind, 0) + payload
            if kind == "all_gather":
                self.largest_gathered_bytes = max(self.largest_gathered_bytes, _nbytes(args[0]))
        return func(*args, **(kwargs or {}))


def _collective_payload(op: str, args) -> tuple[str, int]:
    if op.startswith("allreduce"):
        return "all_reduce", _nbytes(args[0])
    if op.startswith(("_allgather_base", "allgather_into_tensor")):
        return "all_gather", _nbytes(args[1])
    if op.startswith(("_reduce_scatter_base", "reduce_scatter_tensor")):
        return "reduce_scatter", _nbytes(args[1])
    return op, _nbytes(args[0])


def _nbytes(tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.nbytes
    return sum(_nbytes(t) for t in tensors)
