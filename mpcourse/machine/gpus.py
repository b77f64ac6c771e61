"""The NVIDIA GPUs learners meet, and what each computes fast: tensor cores by precision, FP8, memory.

Learners without a GPU of their own reach one through a notebook service: Google Colab's free
tier gives a T4, Kaggle two T4s or a P100, Colab's paid runtimes an L4, an A100 40GB, an H100 or
a G4 (an RTX PRO 6000 Blackwell); cloud machines an H100 (PCIe, NVL or SXM: three sets of
peaks), an H200, a B200 or GB200; AWS's G5 machines an A10G; a gaming PC an RTX 3090 (sm_86) or
4090 (sm_89). Which 16-bit format pays off differs between them, and torch's own answer can
mislead: on a T4, `torch.cuda.is_bf16_supported()` is True because bf16 *runs* (emulated,
through FP32 arithmetic), but a T4 has no BF16 tensor cores, so bf16 there is slower than fp16
and gains nothing over fp32.

Each class holds its datasheet's *dense* peaks (NVIDIA lists tensor-core rates "with sparsity",
twice the dense ones; the dense rate is what training reaches), as a `performance.Device`, the
roofline of lesson 00, and names the datasheet (document and year) its figures come from. A
precision counts as accelerated where its peak beats FP32's; `GpuClass.mfu` divides a measured
rate by the peak of its precision. GPUs not in the table are judged by compute capability alone
(tensor cores for FP16 from sm_70, for TF32/BF16 from sm_80, for FP8 from sm_89), and the lab
reports their measured speed only.
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
    source: str                   # the datasheet (name, year) every figure of `device` comes from

    @property
    def sm(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def accelerated(self, precision: str) -> bool:
        """Whether `precision`'s datasheet peak beats FP32's (FP32 itself: the baseline, yes)."""
        peaks = self.device.peak_flops
        return precision == "fp32" or peaks.get(precision, 0.0) > peaks["fp32"]

    def mfu(self, flops_per_s: float, precision: str) -> float | None:
        """Model FLOPs utilisation: `flops_per_s` achieved over the dense datasheet peak of
        `precision` (None where the datasheet lists none, e.g. bf16 on a T4, which emulates it)."""
        peak = self.device.peak_flops.get(precision)
        return flops_per_s / peak if peak else None


def _device(name: str, bandwidth_gb_s: float, **tflops: float) -> Device:
    return Device(name, {p: t * TERA for p, t in tflops.items()}, bandwidth=bandwidth_gb_s * GB)


def _sparse(name: str, bandwidth_gb_s: float, fp32: float, **sparse_tflops: float) -> Device:
    """A device from a datasheet that lists its tensor-core rates "with sparsity" (twice the dense
    rates training reaches): the dense peaks are half of them."""
    return _device(name, bandwidth_gb_s, fp32=fp32, **{p: t / 2 for p, t in sparse_tflops.items()})


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS dense"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2024), "
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), "
_BLACKWELL = "NVIDIA GB200 NVL72 and HGX B200 datasheet (2025), individual Blackwell GPU, "
_CLOUD = "Colab's paid tiers, cloud machines"
CLASSES = (
    GpuClass("T4", r"\bT4\b", "Turing", (7, 5), 16 * GB, _device("T4", 320, fp32=8.1, fp16=65),
             "Colab's free tier; Kaggle (two of them)",
             "NVIDIA T4 Tensor Core GPU datasheet (2019): FP32 8.1, mixed FP16/FP32 65 TFLOPS, 320 GB/s"),
    GpuClass("P100", r"P100", "Pascal", (6, 0), 16 * GB,
             _device("P100 PCIe", 732, fp32=9.3, fp16=18.7), "Kaggle",
             "NVIDIA Tesla P100 PCIe datasheet (2016): FP32 9.3, FP16 18.7 TFLOPS (CUDA cores), 732 GB/s"),
    GpuClass("L4", r"\bL4\b", "Ada", (8, 9), 24 * GB,
             _sparse("L4", 300, fp32=30.3, tf32=120, bf16=242, fp16=242, fp8=485),
             "Colab's paid tiers, Google Cloud G2",
             "NVIDIA L4 Tensor Core GPU datasheet (2023): FP32 30.3; TF32 120, BF16/FP16 242, FP8 485 "
             "TFLOPS with sparsity; 300 GB/s"),
    GpuClass("A10G", r"\bA10G?\b", "Ampere", (8, 6), 24 * GB,
             _device("A10", 600, fp32=31.2, tf32=62.5, bf16=125, fp16=125), "AWS G5 machines",
             "NVIDIA A10 Tensor Core GPU datasheet (2021): FP32 31.2, TF32 62.5, BF16/FP16 125 TFLOPS "
             "dense, 600 GB/s (AWS's A10G shares its memory; its tensor rates are somewhat lower)"),
    GpuClass("A100 40GB", r"A100.*40GB", "Ampere", (8, 0), 40 * GB,
             _device("A100 40GB", 1555, fp32=19.5, tf32=156, bf16=312, fp16=312),
             _CLOUD + " (Colab's A100 is this one)", _A100 + "; 1,555 GB/s for the 40GB SXM and PCIe"),
    GpuClass("A100 80GB PCIe", r"A100.*80GB.*PCIe|A100-PCIE-80GB", "Ampere", (8, 0), 80 * GB,
             _device("A100 80GB PCIe", 1935, fp32=19.5, tf32=156, bf16=312, fp16=312), "cloud machines",
             _A100 + "; 1,935 GB/s for the 80GB PCIe"),
    GpuClass("A100 80GB SXM", r"A100.*80GB", "Ampere", (8, 0), 80 * GB, A100_SXM, "cloud machines",
             _A100 + "; 2,039 GB/s for the 80GB SXM (mpcourse.machine.performance.A100_SXM)"),
    GpuClass("H100 PCIe", r"H100 PCIe", "Hopper", (9, 0), 80 * GB,
             _sparse("H100 PCIe", 2000, fp32=51, tf32=756, bf16=1513, fp16=1513, fp8=3026), "cloud machines",
             _H100 + "H100 PCIe: FP32 51; TF32 756, BF16/FP16 1,513, FP8 3,026 TFLOPS with sparsity; "
             "2 TB/s"),
    GpuClass("H100 NVL", r"H100 NVL", "Hopper", (9, 0), 94 * GB,
             _sparse("H100 NVL", 3900, fp32=60, tf32=835, bf16=1671, fp16=1671, fp8=3341), "cloud machines",
             _H100 + "H100 NVL, per GPU: FP32 60; TF32 835, BF16/FP16 1,671, FP8 3,341 TFLOPS with "
             "sparsity; 94 GB at 3.9 TB/s"),
    GpuClass("H100 SXM", r"H100 80GB HBM3|H100 SXM", "Hopper", (9, 0), 80 * GB, H100_SXM, _CLOUD,
             _H100 + "H100 SXM: FP32 67; TF32 989, BF16/FP16 1,979, FP8 3,958 TFLOPS with sparsity; "
             "3.35 TB/s (mpcourse.machine.performance.H100_SXM)"),
    GpuClass("H200 NVL", r"H200 NVL", "Hopper", (9, 0), 141 * GB,
             _sparse("H200 NVL", 4800, fp32=60, tf32=835, bf16=1671, fp16=1671, fp8=3341), "cloud machines",
             _H200 + "H200 NVL: FP32 60; TF32 835, BF16/FP16 1,671, FP8 3,341 TFLOPS with sparsity; "
             "141 GB at 4.8 TB/s"),
    GpuClass("H200", r"\bH200\b", "Hopper", (9, 0), 141 * GB,
             _sparse("H200 SXM", 4800, fp32=67, tf32=989, bf16=1979, fp16=1979, fp8=3958), "cloud machines",
             _H200 + "H200 SXM: FP32 67; TF32 989, BF16/FP16 1,979, FP8 3,958 TFLOPS with sparsity; "
             "141 GB at 4.8 TB/s"),
    GpuClass("B200", r"\bB200\b", "Blackwell", (10, 0), 180 * GB,
             _sparse("HGX B200", 7700, fp32=75, tf32=2200, bf16=4500, fp16=4500, fp8=9000), "cloud machines",
             _BLACKWELL + "HGX B200: FP32 75 TFLOPS; TF32 2.2, FP16/BF16 4.5, FP8 9 PFLOPS with "
             "sparsity; 180 GB at 7.7 TB/s"),
    GpuClass("GB200", r"\bGB200\b", "Blackwell", (10, 0), 186 * GB,
             _sparse("GB200", 8000, fp32=80, tf32=2500, bf16=5000, fp16=5000, fp8=10000), "cloud machines",
             _BLACKWELL + "GB200 NVL72: FP32 80 TFLOPS; TF32 2.5, FP16/BF16 5, FP8 10 PFLOPS with "
             "sparsity; 186 GB at 8 TB/s"),
    GpuClass("RTX PRO 6000 Blackwell", r"RTX PRO 6000 Blackwell Server Edition", "Blackwell", (12, 0),
             96 * GB, _sparse("RTX PRO 6000 Blackwell Server", 1597, fp32=120, tf32=500, bf16=1000,
                              fp16=1000, fp8=2000),
             "Colab's G4 runtime, Google Cloud G4",
             "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet (2025): FP32 120 TFLOPS, FP4 4 PFLOPS "
             "with sparsity, 96 GB GDDR7 at 1,597 GB/s. It lists no FP8/BF16/TF32 rate: those are the FP4 "
             "figure halved per doubling of the format's width, as the RTX Blackwell architecture "
             "whitepaper (2025) lays the tensor rates out (FP4 = 2 x FP8 = 4 x FP16 = 8 x TF32)"),
    GpuClass("RTX 3090 (sm_86)", r"RTX 30[0-9]0|RTX A[0-9]000", "Ampere", (8, 6), 24 * GB,
             _device("RTX 3090", 936, fp32=35.6, tf32=35.6, bf16=71, fp16=71), "a gaming or workstation PC",
             "NVIDIA Ampere GA102 GPU architecture whitepaper (2020), RTX 3090: FP32 35.6, TF32 35.6, "
             "FP16/BF16 tensor with FP32 accumulate 71 TFLOPS dense, 936 GB/s (GeForce: FP32 "
             "accumulation at half the FP16-accumulate rate)"),
    GpuClass("RTX 4090 (sm_89)", r"RTX 40[0-9]0|RTX [0-9]000 Ada", "Ada", (8, 9), 24 * GB,
             _device("RTX 4090", 1008, fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3),
             "a gaming or workstation PC",
             "NVIDIA Ada GPU architecture whitepaper (2022), RTX 4090: FP32 82.6, TF32 82.6, FP16/BF16 "
             "with FP32 accumulate 165.2, FP8 with FP32 accumulate 330.3 TFLOPS dense, 1,008 GB/s"),
)


def identify(device_name: str) -> GpuClass | None:
    """The class of the GPU torch calls `device_name` (None if the table does not know it)."""
    return next((gpu for gpu in CLASSES if re.search(gpu.pattern, device_name)), None)


def gpu_class(name: str) -> GpuClass:
    """The class named `name` ("T4", "A100 40GB", "H100 SXM", ...); a clear error for any other name."""
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


def describe(device_name: str, capability: tuple[int, int], memory_bytes: int | None) -> str:
    """Two lines for `mpcourse doctor`: the GPU's class and what its tensor cores run; for a GPU
    the table does not know, one line that says so, with its name and compute capability."""
    memory = f"{memory_bytes / GB:.0f} GB" if memory_bytes else "memory unknown"
    gpu = identify(device_name)
    if gpu is None:
        sm = f"sm_{capability[0]}{capability[1]}"
        return (f"GPU class    {device_name} ({sm}, {memory}) is not in the table of "
                f"mpcourse.machine.gpus: what it accelerates is judged by {sm} alone, and the lab "
                "reports its measured speed, with no datasheet peak to give an MFU")
    return (f"GPU class    {gpu.name}: {gpu.architecture}, {gpu.sm}, {memory} at "
            f"{gpu.device.bandwidth / GB:,.0f} GB/s; learners meet it on {gpu.where}\n"
            f"             faster than fp32 here: "
            f"{', '.join(p for p in PRECISIONS if p != 'fp32' and gpu.accelerated(p)) or 'nothing'}")
