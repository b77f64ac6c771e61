"""Recorded CPUs, so that any machine can show what a lesson does on another one.

The course branches on the CPU it finds: which 16-bit formats have instructions (the flags),
and which ran fast in a one-second calibration (the matmul probe). A learner on a laptop
without AVX512-BF16 sees other sizes, warnings and choices than one on a Xeon with AMX. Setting
`MPCOURSE_HARDWARE=<profile>` replaces both the detected flags and the probe with one of the
recorded CPUs below, so `mpcourse doctor`, the lab and every lesson behave as they would there.
Only what the course *decides* changes: the arithmetic still runs on this machine's kernels,
and timings measured in a lesson are still this machine's.

Each profile says where its calibration comes from: measured on a course machine, or, where
none was at hand, modelled and said so.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

VARIABLE = "MPCOURSE_HARDWARE"


@dataclass(frozen=True)
class CpuProfile:
    """A CPU as the course sees it: its flags, its vector ISA, and its matmul calibration.

    `probe_seconds` are the fastest times of one `probe_n`x`probe_n` matmul on one thread in
    fp32, bf16 and fp16 (what `hardware.probe_matmuls` measures); only their ratios matter.
    """
    name: str
    cpu: str
    flags: frozenset[str]
    cpu_capability: str
    probe_n: int
    probe_seconds: dict[str, float]
    source: str


# fp32's time is the same in every profile: the probe compares formats on one CPU, never CPUs.
_FP32_S = 0.312e-3

PROFILES = {profile.name: profile for profile in (
    CpuProfile(
        "avx2", "x86-64 with AVX2 only (most Intel laptops; AMD EPYC Rome and Milan)",
        frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"}), "AVX2", 256,
        {"fp32": _FP32_S, "bf16": 41.3e-3, "fp16": 40.9e-3},
        "measured on an AMD EPYC with torch's kernels held to AVX2 (ATEN_CPU_CAPABILITY=avx2 "
        "ONEDNN_MAX_CPU_ISA=AVX2), torch 2.13, 2026-12-01: both 16-bit formats emulated, ~0.008x"),
    CpuProfile(
        "avx512-bf16", "x86-64 with AVX512-BF16 (e.g. AMD EPYC Genoa, Intel Cooper Lake)",
        frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"}),
        "AVX512", 256, {"fp32": _FP32_S, "bf16": 0.0816e-3, "fp16": 41.6e-3},
        "measured on an AMD EPYC with AVX512-BF16, torch 2.13, 2026-12-01: bf16 3.8x, fp16 "
        "emulated, 0.0075x"),
    CpuProfile(
        "amx", "x86-64 with AMX-BF16 and AVX512-FP16 (Intel Xeon, Sapphire Rapids and later)",
        frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16",
                   "avx512_fp16", "amx_tile", "amx_bf16"}),
        "AVX512", 256, {"fp32": _FP32_S, "bf16": _FP32_S / 2.0, "fp16": _FP32_S / 1.1},
        "ratios measured in earlier course sessions on an Intel Xeon with AMX-BF16 and "
        "AVX512-FP16, torch 2.13, 2026-11: bf16 matmuls 2 to 5.7x fp32 (2x at this size), "
        "fp16 about 1.1x"),
    CpuProfile(
        "arm", "64-bit ARM with FP16 and BF16 (Apple M2 and later, AWS Graviton 3)",
        frozenset({"fp", "asimd", "fphp", "asimdhp", "bf16", "i8mm"}), "DEFAULT", 256,
        {"fp32": _FP32_S, "bf16": _FP32_S / 2.0, "fp16": _FP32_S / 2.0},
        "modelled, not measured (no such machine was at hand): 16-bit SIMD lanes are half the "
        "width of fp32's, so 2x for both"),
)}


def active_profile() -> CpuProfile | None:
    """The profile `MPCOURSE_HARDWARE` names, or None when it is unset or empty."""
    name = os.environ.get(VARIABLE, "").strip()
    if not name:
        return None
    if name not in PROFILES:
        raise ValueError(f"{VARIABLE}={name!r} is not a hardware profile; choose one of "
                         f"{', '.join(PROFILES)}, or unset it to use this machine's own CPU")
    return PROFILES[name]


@contextmanager
def simulated(name: str):
    """Within the block, the course decides as on the recorded CPU `name` (as if
    `MPCOURSE_HARDWARE=name` had been set); afterwards, as before."""
    if name not in PROFILES:
        raise ValueError(f"{name!r} is not a hardware profile; choose one of {', '.join(PROFILES)}")
    before = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = name
    try:
        yield PROFILES[name]
    finally:
        if before is None:
            del os.environ[VARIABLE]
        else:
            os.environ[VARIABLE] = before
