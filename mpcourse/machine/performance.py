"""How fast an operation can possibly run: the roofline model, tensor-core shapes, and a profiler check.

An operation has to do two things: compute its floating-point operations (FLOPs) and move its
bytes between memory and the chip. A device does each at a peak rate, FLOP/s and bytes/s
(its memory bandwidth), so the operation takes at least

    max(flops / peak_flops, bytes / bandwidth)

seconds. The ratio flops / bytes, the operation's *arithmetic intensity*, says which term wins:
below the device's *ridge point* (peak_flops / bandwidth) the operation is **memory-bound** and
only fewer bytes make it faster; above it, it is **compute-bound** and only a faster arithmetic
unit does. That is why 16-bit formats speed up two kinds of operations for two different
reasons: an element-wise op (add, GELU, a cast) does about one FLOP per element and is
memory-bound on every device, so it gains from 16 bits exactly because half the bytes move; a
large matmul is compute-bound, so it gains only where 16-bit inputs run on faster units
(tensor cores), and its speed-up is the ratio of the peaks, not of the bytes.

The model is a bound, not a prediction: real kernels reach perhaps 60 to 90% of either peak.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from mpcourse.numbers.precision import dtype_name


@dataclass(frozen=True)
class Work:
    """What one operation must do: `flops` floating-point operations and `bytes_moved` bytes of
    memory traffic, counting each input read once and each output written once (the least any
    kernel can move; a kernel that re-reads its inputs moves more)."""
    name: str
    flops: int
    bytes_moved: int

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs done per byte moved."""
        return self.flops / self.bytes_moved


def _itemsize(dtype: torch.dtype) -> int:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"need a floating-point torch.dtype, got {dtype!r}")
    return dtype.itemsize


def _positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def matmul_work(m: int, n: int, k: int, dtype: torch.dtype) -> Work:
    """An (m x k) @ (k x n) matmul with inputs and output in `dtype`: m*n*k multiply-adds, that
    is 2*m*n*k FLOPs, and the bytes of A, B and C once each."""
    _positive(m=m, n=n, k=k)
    itemsize = _itemsize(dtype)
    return Work(f"matmul {m}x{k} @ {k}x{n} ({dtype_name(dtype)})", 2 * m * n * k,
                (m * k + k * n + m * n) * itemsize)


def elementwise_work(numel: int, dtype: torch.dtype, *, reads: int = 1, writes: int = 1,
                     flops_per_element: int = 1, name: str = "element-wise") -> Work:
    """An element-wise op over `numel` elements of `dtype` that reads `reads` tensors and writes
    `writes` (x * 2: reads=1; x + y: reads=2), doing `flops_per_element` FLOPs per element."""
    _positive(numel=numel, reads=reads, writes=writes)
    if not isinstance(flops_per_element, int) or flops_per_element < 0:
        raise ValueError(f"flops_per_element must be an int >= 0, got {flops_per_element!r}")
    itemsize = _itemsize(dtype)
    return Work(f"{name} ({dtype_name(dtype)})", numel * flops_per_element,
                numel * (reads + writes) * itemsize)



def gpt_training_flops(n_layers: int, d_model: int, seq_len: int, vocab_size: int) -> int:
    """Training FLOPs per token of the course's GPT (mpcourse.train.models), causal attention.

    Forward: 2 FLOPs per matmul weight, each layer's 12 * d_model**2 (query/key/value 3, output
    projection 1, MLP 8) and the output layer's vocab_size * d_model; and attention, whose
    scores (Q K^T) and weighted sum (A V) take 2 * d_model FLOPs per key each. A causal token
    attends to half of the seq_len keys on average (FlashAttention skips the masked half), so
    attention is 2 * d_model * seq_len per layer: half of nanoGPT's count, which includes the
    masked scores. Backward repeats every matmul twice, so training is 3x the forward. Biases,
    LayerNorm, softmax, GELU and the position embedding do no matmul and are left out.
    """
    _positive(n_layers=n_layers, d_model=d_model, seq_len=seq_len, vocab_size=vocab_size)
    matmul_weights = n_layers * 12 * d_model**2 + vocab_size * d_model
    return 3 * (2 * matmul_weights + n_layers * 2 * d_model * seq_len)


@dataclass(frozen=True)
class Device:
    """A device as the roofline sees it: its peak dense FLOP/s for each precision it
    accelerates ("fp32" on ordinary cores, "tf32", "bf16", "fp16", "fp8" on tensor cores) and
    its memory bandwidth in bytes/s."""
    name: str
    peak_flops: dict[str, float]
    bandwidth: float

    def peak(self, precision: str) -> float:
        """Peak FLOP/s of `precision` on this device."""
        if precision not in self.peak_flops:
            raise ValueError(f"{self.name} has no {precision!r} peak; it lists "
                             + ", ".join(self.peak_flops))
        return self.peak_flops[precision]

    def ridge_point(self, precision: str) -> float:
        """The arithmetic intensity (FLOP/byte) above which `precision` is compute-bound."""
        return self.peak(precision) / self.bandwidth

    def compute_seconds(self, work: Work, precision: str) -> float:
        return work.flops / self.peak(precision)

    def memory_seconds(self, work: Work) -> float:
        return work.bytes_moved / self.bandwidth

    def time_bound(self, work: Work, precision: str) -> float:
        """The least time `work` can take at `precision`: the slower of computing and moving."""
        return max(self.compute_seconds(work, precision), self.memory_seconds(work))

    def attainable_flops(self, intensity: float, precision: str) -> float:
        """The roofline itself: the FLOP/s reachable at `intensity` FLOP/byte."""
        return min(self.peak(precision), intensity * self.bandwidth)

    def memory_bound(self, work: Work, precision: str) -> bool:
        """Whether moving the bytes takes longer than the arithmetic at `precision`."""
        return work.intensity < self.ridge_point(precision)


TERA = 1e12
# NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column): FP32 19.5 TFLOPS, TF32 Tensor
# Core 156, BF16/FP16 Tensor Core 312 (the 312/624/624 figures are "with sparsity", twice
# these), GPU memory bandwidth 2,039 GB/s. Ampere has no FP8 tensor cores.
A100_SXM = Device("A100 SXM 80GB", {"fp32": 19.5 * TERA, "tf32": 156 * TERA, "bf16": 312 * TERA,
                                    "fp16": 312 * TERA}, bandwidth=2.039e12)
# NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): FP32 67 TFLOPS; TF32 989, BF16/FP16
# 1,979 and FP8 3,958 TFLOPS are listed "with sparsity", so the dense peaks are half of them
# (the Hopper whitepaper gives 494.7, 989.4 and 1,978.9); GPU memory bandwidth 3.35 TB/s.
H100_SXM = Device("H100 SXM", {"fp32": 67 * TERA, "tf32": 989 / 2 * TERA, "bf16": 1979 / 2 * TERA,
                               "fp16": 1979 / 2 * TERA, "fp8": 3958 / 2 * TERA},
                  bandwidth=3.35e12)


def tensor_core_multiple(dtype: torch.dtype) -> int:
    """The multiple every matmul dimension should have for `dtype` to run on tensor cores
    efficiently: 16 bytes' worth of elements, so 4 for FP32 inputs (TF32), 8 for FP16/BF16 and
    16 for FP8.

    The rule is NVIDIA's (Deep Learning Performance Documentation, "Matrix Multiplication
    Background User's Guide", Tensor Core requirements; cuBLAS documentation, "Tensor Core
    Usage"): tensor cores read operands in 16-byte-aligned pieces. Since cuBLAS 11 a
    misaligned shape still runs, but on slower kernels or with padding done for you; on A100,
    multiples of 64 bytes (32 FP16 elements) do better still.
    """
    if dtype not in _TENSOR_CORE_DTYPES:
        raise ValueError(f"tensor cores take {', '.join(map(dtype_name, _TENSOR_CORE_DTYPES))} "
                         f"inputs, not {dtype!r}")
    return 16 // dtype.itemsize


_TENSOR_CORE_DTYPES = (torch.float32, torch.float16, torch.bfloat16,
                       torch.float8_e4m3fn, torch.float8_e5m2)


def tensor_core_friendly(shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether every dimension in `shape` (for a matmul: m, n and k) is a multiple of
    `tensor_core_multiple(dtype)`."""
    multiple = tensor_core_multiple(dtype)
    _positive(**{f"shape[{i}]": size for i, size in enumerate(shape)})
    return all(size % multiple == 0 for size in shape)


def padded(size: int, dtype: torch.dtype) -> int:
    """`size` rounded up to the next tensor-core multiple for `dtype` (GPT-2's vocabulary of
    50,257 tokens becomes 50,264 for bf16; nanoGPT pads to 50,304, a multiple of 64)."""
    _positive(size=size)
    multiple = tensor_core_multiple(dtype)
    return math.ceil(size / multiple) * multiple


# The profiler names element types the way C++ does; these are the floating-point ones.
_PROFILER_DTYPES = {"float": torch.float32, "double": torch.float64, "c10::Half": torch.float16,
                    "c10::BFloat16": torch.bfloat16, "c10::Float8_e4m3fn": torch.float8_e4m3fn,
                    "c10::Float8_e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class KernelCall:
    """One operation or kernel the profiler saw: its name, where it ran ("cpu" for an aten op
    or oneDNN primitive, "cuda" for a GPU kernel), and the dtypes and shapes of its
    floating-point tensor inputs (empty for GPU kernels, whose inputs the profiler does not
    record)."""
    name: str
    device: str
    input_dtypes: tuple[torch.dtype, ...]
    input_shapes: tuple[tuple[int, ...], ...] = ()

    def matmul_dims(self) -> tuple[int, int, int]:
        """(m, n, k) of an `aten::mm`, `aten::addmm` or `aten::bmm` call: (m x k) @ (k x n)."""
        if self.name not in _MATMUL_OPERANDS:
            raise ValueError(f"{self.name} is not one of the matmuls {', '.join(_MATMUL_OPERANDS)}")
        a, b = (self.input_shapes[i] for i in _MATMUL_OPERANDS[self.name])
        return a[-2], b[-1], a[-1]

    def __str__(self) -> str:
        dtypes = ", ".join(dtype_name(d) for d in self.input_dtypes)
        return f"{self.name} [{self.device}]" + (f" ({dtypes})" if dtypes else "")


def kernels_that_ran(fn: Callable[[], object]) -> list[KernelCall]:
    """Run `fn()` once under `torch.profiler` and list, in order, the operations and kernels it ran.

    This is how you check that a fast path was actually taken rather than assumed: a bf16
    matmul on a CPU shows up as `aten::mm` or `aten::addmm` with BFloat16 inputs; on a GPU the
    CUDA kernel's own name says which unit did the work (a name with `bf16` and `gemm` or
    `xmma`, or `tf32` for a TF32 matmul, runs on tensor cores; `sgemm` or `ampere_sgemm` means
    plain FP32 on CUDA cores). On Hopper and Blackwell most of cuBLAS's GEMMs are `nvjet_*`
    kernels: `kernel_names.is_matmul_kernel` recognises both kinds.
    """
    if not callable(fn):
        raise TypeError(f"kernels_that_ran needs a function to call, got {fn!r} "
                        f"({type(fn).__name__})")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with native_stderr_silenced():
        with torch.profiler.profile(activities=activities, record_shapes=True) as profile:
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    calls = []
    for event in sorted(profile.events(), key=lambda e: e.time_range.start):
        on_gpu = event.device_type == torch.autograd.DeviceType.CUDA
        tensors = [] if on_gpu else [(_PROFILER_DTYPES[d], tuple(shape)) for d, shape
                                     in zip(event.input_dtypes, event.input_shapes)
                                     if d in _PROFILER_DTYPES]
        calls.append(KernelCall(event.name, "cuda" if on_gpu else "cpu",
                                tuple(d for d, _ in tensors), tuple(s for _, s in tensors)))
    return calls


# Which of a matmul op's floating-point tensor inputs are A and B (addmm's first is the bias).
_MATMUL_OPERANDS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1)}


@contextlib.contextmanager
def native_stderr_silenced():
    """Nothing reaches file descriptor 2 inside: torch.profiler's C++ side logs its start and
    stop lines there, which would land on a lesson's stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
