"""The peak of every tensor byte alive during a call, op by op: an optimizer step's transients.

Lesson 02's CPU accounting (`mpcourse.memory.measure.measure_peak_memory`) adds up the tensors a
training step keeps: parameters, gradients, optimizer state, tensors saved for backward. An
optimizer's `step()` also makes temporaries: FP32 copies of 16-bit weights and gradients,
decoded moments, the update itself. They never show in the optimizer's state, but they are
memory while they live, and the peak is what decides whether a model fits.

`measure_live_peak(fn, held)` counts them the same way, by tensor storage (each storage once,
views free), but watches every op: a `TorchDispatchMode` sees each op's outputs as they are made,
and a weak reference to each storage says when it is freed. The peak is the largest sum of the
storages alive right after an op returned, when its inputs and its output exist together, which
is when an allocator holds the most.

An op's own scratch memory is invisible to the mode, with one exception counted by rule:
`aten::index` (`book[codes]`) copies an index tensor that is not int64 into an int64 one and
frees it before it returns (`torch.profiler` shows the copy as an `aten::to` inside
`aten::index`). The dynamic code's search indexes with int32 tensors of the whole moment, so
that copy, 8 bytes a value, is its largest moment; it is added to the op's peak. What stays
unseen: the scratch of other kernels and the allocator's own overhead (on CUDA,
`torch.cuda.max_memory_allocated` reads the allocator's peak directly, each block rounded up
to its allocation granularity).

The count depends only on which tensors the code makes, not on the CPU's kernels, so it is the
same on every machine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True)
class LivePeak:
    """Bytes alive during one call: at its start (`held`), at its peak, and at its end."""
    held: int
    peak: int
    end: int
    peak_op: str   # the op right after which the peak was reached

    @property
    def transient(self) -> int:
        """What the call added at its peak above what was held when it started."""
        return self.peak - self.held


class _LiveStorages(TorchDispatchMode):
    def __init__(self, held: Iterable[torch.Tensor]):
        super().__init__()
        self.alive: dict[int, tuple[StorageWeakRef, int]] = {}
        for tensor in held:
            self._add(tensor)
        self.held = self.total()
        self.peak, self.peak_op = self.held, "(start)"

    def _add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() and key not in self.alive:
            self.alive[key] = (StorageWeakRef(storage), storage.nbytes())

    def total(self) -> int:
        for key in [k for k, (ref, _) in self.alive.items() if ref.expired()]:
            del self.alive[key]  # freed: its address may be handed out again
        return sum(size for _, size in self.alive.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.total()
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
                self._add(leaf)
        now = self.total() + index_copy_bytes(func, args)
        if now > self.peak:
            self.peak, self.peak_op = now, str(func.__name__)
        return out


def index_copy_bytes(func, args) -> int:
    """Bytes of the int64 copies `aten::index` makes, inside the op, of its index tensors that
    are int32 (torch accepts int64, int32, and byte or bool masks); 0 for every other op."""
    if func is not torch.ops.aten.index.Tensor:
        return 0
    indices = args[1]
    return sum(8 * index.numel() for index in indices
               if index is not None and index.dtype == torch.int32)


def measure_live_peak(fn: Callable[[], object],
                      held: Callable[[], Iterable[torch.Tensor]] = list) -> LivePeak:
    """Call `fn()` once; the peak of the bytes alive, counting the storages of the tensors
    `held()` lists (what exists before the call and matters: parameters, gradients, optimizer
    state; a function, so that no list of them stays alive through the call) and of every
    tensor an op makes during the call, until it is freed."""
    watch = _LiveStorages(held())
    with watch:
        fn()
    return LivePeak(watch.held, watch.peak, watch.total(), watch.peak_op)


def held_tensors(model: torch.nn.Module, optimizer) -> list[torch.Tensor]:
    """What a training step keeps between steps: the parameters and their gradients, every
    tensor in the optimizer's state, and the gradients those carry (an FP32 accumulator)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(getattr(optimizer, "state", None), dict):
        raise TypeError(f"optimizer must be an optimizer with a state dict (torch.optim or mpcourse.optim), "
                        f"got {type(optimizer).__name__}")
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    tensors = [*model.parameters(), *state]
    return tensors + [t.grad for t in tensors if t.grad is not None]
