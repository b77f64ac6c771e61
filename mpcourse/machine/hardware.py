"""What this machine can do with each precision, so lessons can explain what the learner sees.

Speed in mixed precision is a property of hardware, not of the format: BF16 is several times
faster than FP32 on a GPU with tensor cores or a CPU with AVX512-BF16/AMX, and many times
*slower* on a CPU that has to emulate it. `report()` finds out which case the learner is in.

`MPCOURSE_HARDWARE=<profile>` (see `cpu_profiles`) makes the CPU report, the flags and the
calibration those of a recorded CPU instead of this one, so that any machine can show, and
test, what the course does on another.
"""
from __future__ import annotations

import os
import platform
import subprocess
import textwrap
import time
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from mpcourse.machine import cpu_profiles, gpus
from mpcourse.course import LESSONS, Lesson
from mpcourse.numbers.precision import AUTOCAST_DTYPES, PRECISIONS, PrecisionSupport, autocast_dtype


@dataclass(frozen=True)
class HardwareReport:
    torch_version: str
    device_type: str  # "cuda", "mps" or "cpu"
    device_name: str
    compute_capability: tuple[int, int] | None
    threads: int
    cpu_capability: str
    precisions: dict[str, PrecisionSupport] = field(default_factory=dict)
    profile: str | None = None  # the MPCOURSE_HARDWARE profile the CPU facts come from
    gpu_memory_bytes: int | None = None  # a CUDA GPU's total memory, as torch reports it

    def full_size(self, lesson: Lesson) -> bool:
        """Whether `lesson` runs at its full size here (on a CPU, lessons shrink themselves)."""
        needs = lesson.full_size_needs
        if needs == "any":
            return True
        if needs == "cuda":
            return self.device_type == "cuda"
        if needs == "fp8":
            return self.device_type == "cuda" and self.precisions["fp8"].accelerated
        if needs == "multi-gpu":
            return self.device_type == "cuda" and torch.cuda.device_count() >= 2
        raise ValueError(f"unknown hardware need {needs!r} for lesson {lesson.number}")


# Set to 1 by `make gpu-rehearsal`: the lessons take their GPU sizes while running on the CPU.
GPU_REHEARSAL_VARIABLE = "MPCOURSE_GPU_REHEARSAL"


def rehearsing_gpu() -> bool:
    """Whether this process rehearses the GPU sizes on the CPU (`MPCOURSE_GPU_REHEARSAL=1`)."""
    value = os.environ.get(GPU_REHEARSAL_VARIABLE, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{GPU_REHEARSAL_VARIABLE}={value!r}: use 1 to rehearse the GPU sizes, 0 or unset not to")
    return value == "1"


def scaled(cpu, cuda):
    """A size knob: the `cuda` value when a CUDA GPU is present (or its size is rehearsed on the
    CPU, `rehearsing_gpu()`), else the small `cpu` value."""
    return cuda if torch.cuda.is_available() or rehearsing_gpu() else cpu


def report() -> HardwareReport:
    """Inspect the best device torch can use here: CUDA, then Apple's MPS, then the CPU
    (or the recorded CPU that `MPCOURSE_HARDWARE` names: GPUs are never simulated)."""
    profile = cpu_profiles.active_profile()
    common = dict(torch_version=torch.__version__, threads=torch.get_num_threads(),
                  cpu_capability=profile.cpu_capability if profile
                  else torch.backends.cpu.get_cpu_capability())
    if torch.cuda.is_available():
        capability, name = tuple(torch.cuda.get_device_capability(0)), torch.cuda.get_device_name(0)
        return HardwareReport(device_type="cuda", device_name=name, compute_capability=capability,
                              precisions=cuda_precisions(capability, name),
                              gpu_memory_bytes=torch.cuda.get_device_properties(0).total_memory, **common)
    if torch.backends.mps.is_available():
        return HardwareReport(device_type="mps", device_name="Apple GPU (MPS)",
                              compute_capability=None, precisions=_mps_precisions(), **common)
    return HardwareReport(device_type="cpu", device_name=profile.cpu if profile else _cpu_name(),
                          compute_capability=None, precisions=cpu_precisions(cpu_flags()),
                          profile=profile.name if profile else None, **common)


def cuda_precisions(cc: tuple[int, int], device_name: str = "") -> dict[str, PrecisionSupport]:
    """What an NVIDIA GPU of compute capability `cc` (named `device_name` by torch) supports and
    accelerates: `mpcourse.machine.gpus` knows the classes learners meet (a T4 only emulates bf16)."""
    return gpus.precisions(cc, gpus.identify(device_name))


def _mps_precisions() -> dict[str, PrecisionSupport]:
    return {
        "fp32": PrecisionSupport(True, True, "Apple GPU (the baseline)"),
        "tf32": PrecisionSupport(False, False, "TF32 is an NVIDIA tensor-core mode"),
        "bf16": PrecisionSupport(True, False, "runs on recent macOS; no speed-up over fp16"),
        "fp16": PrecisionSupport(True, True, "native half precision on the Apple GPU"),
        "fp8": PrecisionSupport(False, False, "no FP8 on MPS"),
    }


def cpu_precisions(flags: frozenset[str]) -> dict[str, PrecisionSupport]:
    """What a CPU with instruction-set `flags` (see `cpu_flags`) supports and accelerates."""
    bf16_isa = sorted(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    fp16_isa = sorted(flags & {"avx512_fp16", "amx_fp16", "fphp", "asimdhp"})
    return {
        "fp32": PrecisionSupport(True, True, "SIMD fp32 (the baseline)"),
        "tf32": PrecisionSupport(False, False, "TF32 is an NVIDIA tensor-core mode; CPU matmuls stay fp32"),
        "bf16": PrecisionSupport(True, bool(bf16_isa), ", ".join(bf16_isa) if bf16_isa else
                                 "emulated: no AVX512-BF16/AMX, so bf16 math is slower than fp32"),
        "fp16": PrecisionSupport(True, bool(fp16_isa), ", ".join(fp16_isa) if fp16_isa else
                                 "emulated: no native fp16 arithmetic, so fp16 is far slower than fp32"),
        "fp8": PrecisionSupport(True, False, "casts and storage only; no CPU computes in FP8"),
    }


def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags that matter for 16-bit math, as lower-case names (the
    recorded ones of the `MPCOURSE_HARDWARE` profile, where one is set)."""
    profile = cpu_profiles.active_profile()
    return profile.flags if profile else detected_cpu_flags()


@lru_cache(maxsize=1)
def detected_cpu_flags() -> frozenset[str]:
    """This machine's own CPU flags, whatever `MPCOURSE_HARDWARE` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    if platform.system() == "Darwin":  # Apple silicon reports its features through sysctl
        found = set()
        for feature, flag in (("FEAT_BF16", "bf16"), ("FEAT_FP16", "fphp")):
            try:
                out = subprocess.run(["sysctl", "-n", f"hw.optional.arm.{feature}"],
                                     capture_output=True, text=True, timeout=5).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                continue
            if out == "1":
                found.add(flag)
        return frozenset(found)
    return frozenset()


PROBE_DTYPES = {"fp32": torch.float32, **AUTOCAST_DTYPES}
#: A 16-bit precision counts as fast when its probe matmul runs at least this many times as
#: fast as fp32. Measured ratios are far from it on both sides: 2 to 3x where bf16 has
#: instructions, 0.01 to 0.03x where it is emulated.
FAST_SPEEDUP = 1.2


@dataclass(frozen=True)
class MatmulProbe:
    """How long one `n`x`n` matmul took on this CPU in each precision (the fastest of a few runs).

    The instruction-set flags say what the CPU *has*; only a measurement says whether torch's
    kernels use it here (an environment variable such as `ONEDNN_MAX_CPU_ISA` can hide it).
    """
    n: int
    seconds: dict[str, float]

    def speedup(self, precision: str) -> float:
        """How many times faster than fp32 this precision's matmul ran (below 1: slower)."""
        if precision not in self.seconds:
            raise ValueError(f"the probe did not time {precision!r}; it timed "
                             + ", ".join(self.seconds))
        return self.seconds["fp32"] / self.seconds[precision]


def probe_matmuls(n: int = 256, repeats: int = 5, budget_s: float = 0.25) -> MatmulProbe:
    """Time an `n`x`n` CPU matmul in fp32, bf16 and fp16: a calibration of about a second at most.

    It runs on one thread, because it asks what the arithmetic does, not how well threads hand
    work over (on a busy machine two threads can wait for each other and time 50x slower). Each
    precision runs one untimed warm-up, then up to `repeats` timed runs or until `budget_s` has
    passed, and keeps the fastest: other processes can only make a run slower, never faster.
    """
    if n < 1 or repeats < 1 or budget_s <= 0:
        raise ValueError(f"need n >= 1, repeats >= 1 and budget_s > 0, got n={n}, "
                         f"repeats={repeats}, budget_s={budget_s}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        a, b = torch.randn(2, n, n, generator=generator)
        seconds = {}
        for name, dtype in PROBE_DTYPES.items():
            x, y = a.to(dtype), b.to(dtype)
            x @ y  # warm-up: kernel selection, caches
            times, spent = [], 0.0
            while len(times) < repeats and spent < budget_s:
                start = time.perf_counter()
                x @ y
                times.append(time.perf_counter() - start)
                spent += times[-1]
            seconds[name] = min(times)
    finally:
        torch.set_num_threads(threads)
    return MatmulProbe(n, seconds)


def measured_probe() -> MatmulProbe:
    """This process's one calibration (`probe_matmuls`), measured on first use, or the recorded
    one of the `MPCOURSE_HARDWARE` profile, where one is set."""
    profile = cpu_profiles.active_profile()
    return _recorded_probe(profile.name) if profile else _this_machines_probe()


@lru_cache(maxsize=1)
def _this_machines_probe() -> MatmulProbe:
    return probe_matmuls()


@lru_cache(maxsize=None)
def _recorded_probe(profile: str) -> MatmulProbe:
    recorded = cpu_profiles.PROFILES[profile]
    return MatmulProbe(recorded.probe_n, dict(recorded.probe_seconds))


def is_fast(precision: str, probe: MatmulProbe | None = None) -> bool:
    """Whether `precision` ran at least `FAST_SPEEDUP` times fp32's speed in the CPU calibration
    (`probe`, by default this process's `measured_probe()`); fp32, the baseline, always is."""
    return precision == "fp32" or (probe or measured_probe()).speedup(precision) >= FAST_SPEEDUP


@dataclass(frozen=True)
class SpeedPrediction:
    """Whether autocast to `dtype` should beat FP32 on this hardware, and the reason."""
    dtype: str
    device_type: str
    faster_than_fp32: bool
    reason: str


def predict_autocast_speed(report: HardwareReport, dtype: str = "bf16") -> SpeedPrediction:
    """Predict from `report()` whether 16-bit autocast speeds matmuls up here.

    16-bit matmuls are faster only where hardware computes in 16 bits: tensor cores on a GPU,
    AVX512-BF16/AMX (or AVX512-FP16) on a CPU. Elsewhere each 16-bit value is converted to FP32
    and back around every operation, which costs more than doing the whole thing in FP32.
    """
    autocast_dtype(dtype)  # a 16-bit precision autocast computes in, or ValueError
    support = report.precisions[dtype]
    if support.accelerated:
        reason = f"{dtype} is accelerated here ({support.how}): expect autocast to be faster"
    else:
        reason = f"{dtype} is not accelerated here ({support.how}): expect autocast to be slower"
    return SpeedPrediction(dtype, report.device_type, support.accelerated, reason)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def format_report(r: HardwareReport) -> str:
    """The report as the table `mpcourse doctor` prints."""
    device = r.device_name
    if r.compute_capability:
        device += f" (compute capability {r.compute_capability[0]}.{r.compute_capability[1]})"
    lines = [f"torch        {r.torch_version}",
             f"device       {r.device_type}: {device}",
             f"CPU threads  {r.threads}   CPU vector ISA: {r.cpu_capability}"]
    if r.profile:
        profile = cpu_profiles.PROFILES[r.profile]
        lines.append(textwrap.fill(
            f"{cpu_profiles.VARIABLE}={r.profile}: a recorded CPU, NOT this machine's own. Its "
            "flags and calibration decide what the course does here; the arithmetic still runs "
            f"on this machine. Calibration: {profile.source}. Unset {cpu_profiles.VARIABLE} to "
            "see this machine.", width=96, initial_indent="profile      ",
            subsequent_indent=" " * 13))
    if r.device_type == "cuda":
        lines.append(gpus.describe(r.device_name, r.compute_capability, r.gpu_memory_bytes))
    lines += ["",
             f"{'precision':<10}{'supported':<11}{'accelerated':<13}how"]
    for name in PRECISIONS:
        p = r.precisions[name]
        lines.append(f"{name:<10}{_yes(p.supported):<11}{_yes(p.accelerated):<13}{p.how}")
    lines += ["", "Lessons on this machine:"]
    for lesson in LESSONS:
        size = "full size" if r.full_size(lesson) else _reduced_because(lesson)
        lines.append(f"  {lesson.number} {lesson.title:<36}{size}")
    return "\n".join(lines)


def _reduced_because(lesson: Lesson) -> str:
    return {"cuda": "reduced size (no CUDA GPU)",
            "fp8": "FP8 by emulation (no FP8-capable GPU)",
            "multi-gpu": "2 CPU processes over gloo (no 2 GPUs)"}[lesson.full_size_needs]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
