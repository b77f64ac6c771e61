"""The precisions a run can choose, by name, and the torch dtypes behind them (lessons 01 and 06).

The training loop, the lab's controls, the command line, the hardware report and the
multi-process runs all speak of precisions by these short names; this module is the one place
that says which names exist and what each means to torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: What a training run's `precision` may be: FP32; FP32 with TF32 tensor-core matmuls (CUDA);
#: autocast to bfloat16 or float16.
RUN_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
#: What the hardware report rates: the run precisions, and FP8 for lesson 07's linears.
PRECISIONS = RUN_PRECISIONS + ("fp8",)
#: The 16-bit types autocast computes in, by name.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


#: The short name the course prints for each floating-point dtype.
SHORT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
               torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2", torch.float64: "fp64"}


def short_name(dtype: torch.dtype | None) -> str:
    """"fp32", "bf16", "fp8_e4m3", ...; torch's own name for other dtypes ("int64"); "-" for None."""
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"short_name takes a torch dtype or None, got {dtype!r}")
    return "-" if dtype is None else SHORT_NAMES.get(dtype, dtype_name(dtype))


def autocast_dtype(precision: str) -> torch.dtype:
    """The dtype autocast computes in for a 16-bit `precision` ("bf16" or "fp16")."""
    if precision not in AUTOCAST_DTYPES:
        raise ValueError(f"precision {precision!r} has no autocast dtype; choose one of "
                         f"{', '.join(AUTOCAST_DTYPES)}")
    return AUTOCAST_DTYPES[precision]


def dtype_name(dtype: torch.dtype) -> str:
    """torch's own name of a dtype without the module prefix: "bfloat16", "float32"."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class PrecisionSupport:
    """What a device does with one precision: whether it runs at all, whether dedicated hardware
    speeds it up, and how. `hardware` says it of this machine's CPU, `gpus` of a GPU class."""
    supported: bool
    accelerated: bool
    how: str
