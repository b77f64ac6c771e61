"""The NVIDIA GPUs learners meet, and what each computes fast: tensor cores by precision, FP8, memory.

Learners without a GPU of their own reach one through a notebook service: Google Colab's free
tier gives a T4, Kaggle two T4s or a P100, paid tiers an L4, A100 or H100; AWS's G5 machines an
A10G; a gaming PC an RTX 3090 (sm_86) or 4090 (sm_89). Which 16-bit format pays off differs
between them, and torch's own answer can mislead: on a T4, `torch.cuda.is_bf16_supported()`
is True because bf16 *runs* (emulated, through FP32 arithmetic), but a T4 has no BF16 tensor
cores, so bf16 there is slower than fp16 and gains nothing over fp32.

Each class holds its datasheet's *dense* peaks (NVIDIA lists tensor-core rates "with sparsity",
twice the dense ones; the dense rate is what training reaches), as a `performance.Device`, the
roofline of lesson 00. A precision counts as accelerated where its peak beats FP32's. GPUs not
in the table are judged by compute capability alone (tensor cores for FP16 from sm_70, for
TF32/BF16 from sm_80, for FP8 from sm_89).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from mpcourse.machine.performance import A100_SXM, H100_SXM, TERA, Device
from mpcourse.numbers.precision import PRECISIONS, PrecisionSupport

GB = 10**9


@dataclass(frozen=True)
class GpuClass:
    """One kind of GPU: how to recognise it, its architecture, memory and datasheet peaks."""
    name: str
    pattern: str                  # a regular expression on torch.cuda.get_device_name()
    architecture: str
    compute_capability: tuple[int, int]
    memory_bytes: int             # the smallest common variant's (the device reports its own)
    device: Device                # dense peak FLOP/s by precision, memory bandwidth
    where: str                    # where learners meet it

    @property
    def sm(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def accelerated(self, precision: str) -> bool:
        """Whether `precision`'s datasheet peak beats FP32's (FP32 itself: the baseline, yes)."""
        peaks = self.device.peak_flops
        return precision == "fp32" or peaks.get(precision, 0.0) > peaks["fp32"]


def _device(name: str, bandwidth_gb_s: float, **tflops: float) -> Device:
    return Device(name, {p: t * TERA for p, t in tflops.items()}, bandwidth=bandwidth_gb_s * GB)


#: Sources, dense figures (half of any "with sparsity" figure): NVIDIA T4 datasheet (FP32 8.1,
#: mixed FP16/FP32 tensor 65 TFLOPS, 320 GB/s, 16 GB); Tesla P100 PCIe datasheet (FP32 9.3, FP16
#: 18.7 on CUDA cores, 732 GB/s, 16 GB); L4 datasheet (FP32 30.3; TF32 120, FP16/BF16 242, FP8
#: 485 with sparsity; 300 GB/s, 24 GB); A10 datasheet (FP32 31.2; TF32 62.5, BF16/FP16 125;
#: 600 GB/s, 24 GB; AWS's A10G shares its memory, its tensor rates are somewhat lower); A100 and
#: H100 in mpcourse.machine.performance; GeForce RTX 3090 (Ampere GA102 whitepaper: FP32 35.6, TF32 35.6,
#: FP16/BF16 tensor with FP32 accumulate 71, 936 GB/s, 24 GB) and RTX 4090 (Ada whitepaper: FP32
#: 82.6, TF32 82.6, FP16/BF16 with FP32 accumulate 165.2, FP8 with FP32 accumulate 330.3,
#: 1,008 GB/s, 24 GB). GeForce cards run FP32 accumulation at half their FP16-accumulate rate.
CLASSES = (
    GpuClass("T4", r"\bT4\b", "Turing", (7, 5), 16 * GB,
             _device("T4", 320, fp32=8.1, fp16=65), "Colab's free tier; Kaggle (two of them)"),
    GpuClass("P100", r"P100", "Pascal", (6, 0), 16 * GB,
             _device("P100 PCIe", 732, fp32=9.3, fp16=18.7), "Kaggle"),
    GpuClass("L4", r"\bL4\b", "Ada", (8, 9), 24 * GB,
             _device("L4", 300, fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5),
             "Colab's paid tiers, Google Cloud G2"),
    GpuClass("A10G", r"\bA10G?\b", "Ampere", (8, 6), 24 * GB,
             _device("A10", 600, fp32=31.2, tf32=62.5, bf16=125, fp16=125), "AWS G5 machines"),
    GpuClass("A100", r"A100", "Ampere", (8, 0), 40 * GB, A100_SXM, "Colab's paid tiers, cloud machines"),
    GpuClass("H100", r"H100|H200|GH200", "Hopper", (9, 0), 80 * GB, H100_SXM,
             "Colab's paid tiers, cloud machines"),
    GpuClass("RTX 3090 (sm_86)", r"RTX 30[0-9]0|RTX A[0-9]000", "Ampere", (8, 6), 24 * GB,
             _device("RTX 3090", 936, fp32=35.6, tf32=35.6, bf16=71, fp16=71), "a gaming or workstation PC"),
    GpuClass("RTX 4090 (sm_89)", r"RTX 40[0-9]0|RTX [0-9]000 Ada", "Ada", (8, 9), 24 * GB,
             _device("RTX 4090", 1008, fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3),
             "a gaming or workstation PC"),
)


def identify(device_name: str) -> GpuClass | None:
    """The class of the GPU torch calls `device_name` (None if the table does not know it)."""
    return next((gpu for gpu in CLASSES if re.search(gpu.pattern, device_name)), None)


def gpu_class(name: str) -> GpuClass:
    """The class named `name` ("T4", "A100", ...); a clear error for any other name."""
    found = next((gpu for gpu in CLASSES if gpu.name == name or gpu.name.split(" (")[0] == name), None)
    if found is None:
        raise ValueError(f"unknown GPU class {name!r}; the table has " + ", ".join(g.name for g in CLASSES))
    return found


def precisions(capability: tuple[int, int], gpu: GpuClass | None = None) -> dict[str, PrecisionSupport]:
    """What a GPU of compute `capability` (and, where known, class `gpu`) supports and accelerates.

    With a class, a precision is accelerated where its datasheet peak beats FP32's; without one,
    by the compute capability's tensor cores alone.
    """
    sm = f"sm_{capability[0]}{capability[1]}"
    if gpu is None:
        tensor = {"fp16": capability >= (7, 0), "tf32": capability >= (8, 0), "bf16": capability >= (8, 0),
                  "fp8": capability >= (8, 9)}
        fast = dict(tensor, fp32=True)
        rate = {p: f"by compute capability {sm} (not in mpcourse.machine.gpus's table)" for p in tensor}
    else:
        peaks = gpu.device.peak_flops
        fast = {p: gpu.accelerated(p) for p in PRECISIONS}
        rate = {p: f"{peaks[p] / TERA:g} TFLOPS dense, {peaks[p] / peaks['fp32']:.1f}x fp32"
                for p in peaks if p != "fp32"}
    fp16_how = (("tensor cores, " if capability >= (7, 0) else "packed half2 on CUDA cores (no tensor "
                 "cores), ") + rate["fp16"]) if fast["fp16"] else \
        f"runs, but on CUDA cores at FP32's rate: this {sm} GPU predates tensor cores (sm_70)"
    return {
        "fp32": PrecisionSupport(True, True, "CUDA cores (the baseline)" if gpu is None else
                                 f"CUDA cores (the baseline), {gpu.device.peak('fp32') / TERA:g} TFLOPS"),
        "tf32": PrecisionSupport(capability >= (8, 0), fast["tf32"], f"tensor cores, {rate['tf32']}" if fast["tf32"]
                                 else f"tensor cores, but no faster than fp32 on this card ({rate['tf32']})"
                                 if capability >= (8, 0) else f"needs Ampere (sm_80) or newer; this GPU is {sm}"),
        "bf16": PrecisionSupport(True, fast["bf16"], f"tensor cores, {rate['bf16']}" if fast["bf16"] else
                                 f"emulated: no BF16 tensor cores before Ampere (sm_80), this GPU is {sm}. "
                                 "torch.cuda.is_bf16_supported() says True because bf16 runs, through FP32 "
                                 "arithmetic: slower than fp16, no faster than fp32"),
        "fp16": PrecisionSupport(True, fast["fp16"], fp16_how),
        "fp8": PrecisionSupport(fast["fp8"], fast["fp8"], f"FP8 tensor cores, {rate['fp8']}" if fast["fp8"]
                                else f"casts only: FP8 matmuls need Ada or Hopper (sm_89+); this GPU is {sm}"),
    }


def describe(gpu: GpuClass | None, capability: tuple[int, int], memory_bytes: int | None) -> str:
    """Two lines for `mpcourse doctor`: the GPU's class and what its tensor cores run."""
    memory = f"{memory_bytes / GB:.0f} GB" if memory_bytes else "memory unknown"
    if gpu is None:
        return (f"GPU class    not in mpcourse.machine.gpus's table: judged by compute capability "
                f"sm_{capability[0]}{capability[1]} alone; {memory}")
    fast = [p for p in PRECISIONS if p != "fp32" and gpu.accelerated(p)]
    return (f"GPU class    {gpu.name}: {gpu.architecture}, {gpu.sm}, {memory} at "
            f"{gpu.device.bandwidth / GB:,.0f} GB/s; learners meet it on {gpu.where}\n"
            f"             faster than fp32 here: {', '.join(fast) if fast else 'nothing'}")
