"""The collectives: what each leaves on each rank, and the bytes a rank hands to each (lesson 08)."""
from __future__ import annotations

import datetime
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def collective_results(inputs: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """What each collective leaves on each rank when rank r contributes `inputs[r]`.

    The collectives are gloo's own: one gloo process group member per rank, each a thread of
    this process, sharing an in-memory store. All-reduce (sum) leaves the sum on every rank;
    all-gather leaves every rank's input, concatenated, on every rank; reduce-scatter leaves
    rank r the r-th of W equal slices of the sum.
    """
    world_size = len(inputs)
    if world_size < 2 or any(not isinstance(t, torch.Tensor) or t.dim() != 1 for t in inputs):
        raise ValueError("inputs must be two or more 1-D tensors, one per rank")
    if len({(t.numel(), t.dtype) for t in inputs}) != 1 or inputs[0].numel() % world_size:
        raise ValueError(f"every rank's input must have the same dtype and a length divisible by "
                         f"the {world_size} ranks, got lengths {[t.numel() for t in inputs]}")
    store = torch.distributed.HashStore()
    results = {name: [None] * world_size for name in COLLECTIVES}
    errors = []

    def rank(r: int) -> None:
        try:
            group = torch.distributed.ProcessGroupGloo(store, r, world_size,
                                                       datetime.timedelta(seconds=30))
            x = inputs[r].clone()
            summed = x.clone()
            group.allreduce([summed]).wait()
            gathered = x.new_empty(world_size * x.numel())
            group._allgather_base(gathered, x).wait()
            scattered = x.new_empty(x.numel() // world_size)
            group._reduce_scatter_base(scattered, x).wait()
            for name, value in zip(COLLECTIVES, (summed, gathered, scattered)):
                results[name][r] = value
        except Exception as error:  # re-raised in the caller's thread
            errors.append(error)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


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
