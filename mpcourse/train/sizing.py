"""The lab's size on this machine: the flags say what is supported, a probe says what is fast.

A small model cannot show a 16-bit speed-up: its steps go to per-operation costs that do not
depend on the precision (autocast's casts, the optimizer, Python), so even on a CPU with bf16
instructions bf16 runs slower than fp32 at the lab's small size. A model wide enough for its
matmuls to dominate shows the real speed-up where the hardware has one, and takes minutes where
16-bit arithmetic is emulated. `lab_size()` chooses between the two from what it measures:

- a CUDA GPU: GPT-2 small's shape, `LESSON_CUDA_CONFIG`, with the batch cut to what fits the
  GPU's memory (`memory.largest_batch`) and the steps to what fits `GPU_RUN_SECONDS` per run,
  predicted from the model's FLOPs and the GPU class's datasheet peak (`mpcourse.machine.gpus`, the
  roofline of lesson 00); it compares fp32 with the 16-bit formats that have tensor cores there
  (on a T4: fp16 with a loss scaler, and not bf16, which a T4 only emulates);
- a CPU on which a bf16 or fp16 matmul ran at least `hardware.FAST_SPEEDUP` times as fast as
  fp32 in the calibration (`hardware.probe_matmuls`, well under a second):
  `LESSON_CPU_MATMUL_CONFIG`;
- any other CPU, and Apple's MPS: the small `LESSON_CPU_CONFIG`, and `reason` says why.

`REFERENCE` is one stored measurement at the matmul-bound size on a machine that accelerates
bf16, so that a learner whose machine emulates 16-bit formats still sees a case where mixed
precision pays off, next to their own live measurement.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from mpcourse.machine import gpus, hardware
from mpcourse.machine.performance import gpt_training_flops
from mpcourse.memory.accounting import largest_batch
from mpcourse.numbers.precision import AUTOCAST_DTYPES, PrecisionSupport
from mpcourse.train.config import (LESSON_CPU_CONFIG, LESSON_CPU_MATMUL_CONFIG, LESSON_CUDA_CONFIG,
                                   RunConfig)

SIXTEEN_BIT = tuple(AUTOCAST_DTYPES)
#: One precision's run in lesson 06 on a GPU should take about this long (the slowest, fp32).
GPU_RUN_SECONDS = 60.0
#: The fraction of the datasheet's dense peak a training step is assumed to reach when the lab
#: predicts its time (0.3 to 0.5 is usual for a model of this size; gpu_check measures it).
GPU_UTILISATION = 0.4
#: The share of the GPU's memory the lab plans to fill: the rest is the CUDA context, the
#: allocator's cache and temporaries that `memory.transformer_memory` leaves out.
GPU_MEMORY_FRACTION = 0.8
GPU_MIN_STEPS = 20


@dataclass(frozen=True)
class LabSize:
    """The lab's configuration for a device, which 16-bit precisions are fast there, and why."""
    config: RunConfig
    device_type: str
    fast: tuple[str, ...]
    reason: str
    #: The FP32 baselines the 16-bit runs are measured against: on a GPU with TF32 tensor cores
    #: both true FP32 and TF32 (PyTorch's default for convolutions, and what many runs use).
    baselines: tuple[str, ...] = ("fp32",)

    @property
    def compare(self) -> tuple[str, ...]:
        """The precisions lesson 06 compares: the baselines and the fast 16-bit ones. On a CPU bf16
        is always among them, so that a learner whose CPU emulates it sees what emulation costs."""
        if self.device_type == "cpu":
            return ("fp32", "bf16") + tuple(p for p in self.fast if p != "bf16")
        return self.baselines + self.fast


def choose_lab_size(device_type: str, precisions: dict[str, PrecisionSupport],
                    probe: hardware.MatmulProbe | None = None, *, gpu: gpus.GpuClass | None = None,
                    memory_bytes: int | None = None, device_name: str = "a CUDA GPU") -> LabSize:
    """The decision alone, from the device's precision table and (on a CPU) the probe's timings;
    on a GPU also from its class (`gpus.identify`), name and memory, where known."""
    if device_type == "cuda":
        return cuda_lab_size(precisions, gpu, memory_bytes, device_name)
    if device_type == "mps":
        return LabSize(LESSON_CPU_CONFIG, "mps", (),
                       "Apple's GPU: the small size (the calibration measures CPUs only)")
    if device_type != "cpu":
        raise ValueError(f"unknown device type {device_type!r}; choose cuda, mps or cpu")
    if probe is None:
        raise ValueError("a CPU's lab size needs the matmul probe (hardware.probe_matmuls())")
    fast = tuple(p for p in SIXTEEN_BIT if precisions[p].supported and hardware.is_fast(p, probe))
    matmul = f"a {probe.n}x{probe.n} matmul"
    if fast:
        measured = ", ".join(f"{p} {probe.speedup(p):.1f}x ({precisions[p].how})" for p in fast)
        return LabSize(LESSON_CPU_MATMUL_CONFIG, "cpu", fast,
                       f"measured fast on this CPU, {matmul} against fp32: {measured}. The lab "
                       f"runs at d_model {LESSON_CPU_MATMUL_CONFIG.d_model}, where matmuls "
                       "dominate a step, so the speed-up shows")
    slow = "; ".join(_why_slow(p, precisions[p], probe.speedup(p)) for p in SIXTEEN_BIT)
    return LabSize(LESSON_CPU_CONFIG, "cpu", (),
                   f"no 16-bit format is fast on this CPU ({matmul} against fp32): {slow}. The "
                   f"lab stays small (d_model {LESSON_CPU_CONFIG.d_model}) so that 16-bit runs "
                   "finish in seconds")


def cuda_lab_size(precisions: dict[str, PrecisionSupport], gpu: gpus.GpuClass | None,
                  memory_bytes: int | None, device_name: str = "a CUDA GPU") -> LabSize:
    """GPT-2 small's shape, its batch fitted to `memory_bytes` and its steps to `GPU_RUN_SECONDS`
    (predicted from the class's datasheet peak; a GPU not in the table keeps the configured steps)."""
    fast = tuple(p for p in SIXTEEN_BIT if precisions[p].accelerated)
    config, notes = LESSON_CUDA_CONFIG, []
    if memory_bytes is not None:
        fits = largest_batch(int(memory_bytes * GPU_MEMORY_FRACTION), config.d_model, config.n_layers,
                             config.seq_len, config.vocab_size, "fp32", "adamw", n_heads=config.n_heads)
        if fits < 1:
            raise ValueError(f"the lab's GPT-2-small shape does not fit {memory_bytes / gpus.GB:.1f} GB "
                             "even at batch 1; run it on the CPU (--device cpu)")
        if fits < config.batch_size:
            config = dataclasses.replace(config, batch_size=fits)
        notes.append(f"batch {config.batch_size} x {config.seq_len} tokens fits "
                     f"{GPU_MEMORY_FRACTION:.0%} of its {memory_bytes / gpus.GB:.0f} GB in fp32 with AdamW")
    if gpu is not None:
        seconds = predicted_step_seconds(config, gpu, "fp32")
        steps = max(GPU_MIN_STEPS, min(config.steps, int(GPU_RUN_SECONDS / seconds)))
        config = dataclasses.replace(config, steps=steps)
        notes.append(f"an fp32 step is predicted at {seconds:.2f} s ({GPU_UTILISATION:.0%} of its "
                     f"{gpu.device.peak('fp32') / 1e12:g} TFLOPS), so {steps} steps take about "
                     f"{steps * seconds:.0f} s")
    else:
        notes.append(f"{device_name} is not in mpcourse.machine.gpus's table: with no datasheet peak to "
                     f"predict a step from, it runs the configured {config.steps} steps and reports the "
                     "speed it measures")
    emulated = [p for p in SIXTEEN_BIT if precisions[p].supported and not precisions[p].accelerated]
    baselines = ("fp32", "tf32") if precisions["tf32"].accelerated else ("fp32",)
    compared = (" and ".join({"fp32": "fp32 (TF32 off)", "tf32": "tf32"}[b] for b in baselines) + " with "
                + (" and ".join(_recipe(p) for p in fast) if fast else "nothing faster"))
    reason = (f"{'a ' + gpu.name if gpu else device_name}: GPT-2 small's shape (d_model "
              f"{config.d_model}, {config.n_layers} layers); the lab compares {compared}")
    if emulated:
        reason += f"; it leaves out {', '.join(emulated)}, emulated here"
    return LabSize(config, "cuda", fast, "; ".join([reason] + notes), baselines)


def _recipe(precision: str) -> str:
    return "fp16 (with a loss scaler)" if precision == "fp16" else precision


def predicted_step_seconds(config: RunConfig, gpu: gpus.GpuClass, precision: str) -> float:
    """One training step's time at `GPU_UTILISATION` of `gpu`'s dense peak for `precision`."""
    flops_per_token = gpt_training_flops(config.n_layers, config.d_model, config.seq_len, config.vocab_size)
    tokens = config.batch_size * config.seq_len
    return flops_per_token * tokens / (gpu.device.peak(precision) * GPU_UTILISATION)


def _why_slow(precision: str, support: PrecisionSupport, speedup: float) -> str:
    if support.accelerated:  # the flags promise instructions the kernels did not use
        return (f"{precision} ran at {speedup:.2f}x although the CPU has {support.how} (torch's "
                "kernels did not use it: is ONEDNN_MAX_CPU_ISA or ATEN_CPU_CAPABILITY set?)")
    return f"{precision} is emulated, {speedup:.2f}x"


def lab_size(device: str = "auto") -> LabSize:
    """The lab's size on `device` ("auto", "cpu", "cuda", "mps") of this machine, measured once."""
    if device.split(":")[0] not in ("auto", "cpu", "cuda", "mps"):
        raise ValueError(f"unknown device {device!r}; choose auto, cpu, cuda or mps")
    device_type = RunConfig(device=device).resolved_device().type
    if device_type == "cpu":
        return choose_lab_size("cpu", hardware.cpu_precisions(hardware.cpu_flags()),
                               hardware.measured_probe())
    report = hardware.report()
    if report.device_type != device_type:
        raise ValueError(f"device {device!r} is not available here (found {report.device_type})")
    if device_type == "cuda":
        capability = tuple(torch.cuda.get_device_capability(0))
        name = torch.cuda.get_device_name(0)
        gpu = gpus.identify(name)
        return choose_lab_size("cuda", gpus.precisions(capability, gpu), gpu=gpu,
                               device_name=f"{name} (sm_{capability[0]}{capability[1]})",
                               memory_bytes=torch.cuda.get_device_properties(0).total_memory)
    return choose_lab_size(device_type, report.precisions)


@dataclass(frozen=True)
class ReferenceRun:
    precision: str
    tokens_per_s: float
    eval_loss: float
    peak_memory_bytes: int


@dataclass(frozen=True)
class ReferenceMeasurement:
    """A dated measurement from a named machine (`benchmarks/bench_lab_size.py --record`)."""
    machine: str
    date: str
    config: RunConfig
    matmul_n: int                       # the calibration's matmul size, and each 16-bit
    matmul_speedups: dict[str, float]   # precision's speed there against fp32
    runs: tuple[ReferenceRun, ...]

    def speedup(self, precision: str) -> float:
        """Tokens/s of `precision`'s run over fp32's."""
        by_precision = {run.precision: run.tokens_per_s for run in self.runs}
        if precision not in by_precision:
            raise ValueError(f"the reference has no {precision!r} run; it has "
                             + ", ".join(by_precision))
        return by_precision[precision] / by_precision["fp32"]

    def table(self) -> str:
        """The measurement as a plain-text table, headed by where and when it was taken."""
        c = self.config
        probe = ", ".join(f"{p} {x:.3g}x" for p, x in self.matmul_speedups.items())
        lines = [f"Measured on {self.machine}, {self.date}",
                 f"d_model {c.d_model}, {c.n_layers} layers, batch {c.batch_size} x {c.seq_len} "
                 f"tokens, {c.steps} steps",
                 f"calibration ({self.matmul_n}x{self.matmul_n} matmul, 1 thread) against fp32: {probe}",
                 f"{'run':<6}{'tokens/s':>10}{'vs fp32':>9}{'peak memory':>14}{'eval loss':>11}"]
        lines += [f"{r.precision:<6}{r.tokens_per_s:>10,.0f}{self.speedup(r.precision):>8.2f}x"
                  f"{r.peak_memory_bytes / 1e6:>11.1f} MB{r.eval_loss:>11.3f}" for r in self.runs]
        return "\n".join(lines)


#: Recorded by `benchmarks/bench_lab_size.py --threads 1 --record` while other jobs shared the
#: machine's two cores (so tokens/s are low in absolute terms; the ratio is what counts). The
#: peak memory was re-measured on 2026-12-01, when the loop began measuring its second step.
REFERENCE = ReferenceMeasurement(
    machine="AMD EPYC with avx512_bf16, 2 cores, 1 thread, torch 2.13.0+cpu",
    date="2026-11-30",
    config=RunConfig(d_model=512, n_layers=2, n_heads=8, seq_len=128, steps=12, lr=0.003),
    matmul_n=256,
    matmul_speedups={"bf16": 1.96, "fp16": 0.031},
    runs=(
        ReferenceRun("fp32", tokens_per_s=2031, eval_loss=5.4757, peak_memory_bytes=150504632),
        ReferenceRun("bf16", tokens_per_s=3364, eval_loss=5.4743, peak_memory_bytes=132940984),
    ),
)
