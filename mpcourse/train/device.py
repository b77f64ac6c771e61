"""Whether a run's precision can run on its device, and whether it runs fast there."""
from __future__ import annotations

import dataclasses
import warnings

from mpcourse.machine import hardware
from mpcourse.numbers.precision import RUN_PRECISIONS, PrecisionSupport
from mpcourse.train.config import RunConfig


class UnacceleratedPrecisionWarning(UserWarning):
    """The precision runs on this device, but without hardware that makes it fast."""


def precision_support(precision: str, device_type: str) -> PrecisionSupport:
    """Check that `precision` can run on `device_type`; warn when it runs without acceleration.

    Raises ValueError for a precision the device cannot run (e.g. bf16 on a GPU older than
    Ampere). TF32 off CUDA is the one documented fallback: it runs as plain FP32, with a warning.
    """
    if precision not in RUN_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(RUN_PRECISIONS)}")
    support = _device_precisions(device_type)[precision]
    if precision == "tf32" and device_type != "cuda":
        warnings.warn(f"tf32 is an NVIDIA tensor-core mode; on {device_type} it runs as plain "
                      "fp32", UnacceleratedPrecisionWarning, stacklevel=3)
        return support
    if not support.supported:
        raise ValueError(f"precision {precision!r} cannot run on this {device_type} device: "
                         f"{support.how}. Choose one of: " + ", ".join(
                             p for p in RUN_PRECISIONS if _device_precisions(device_type)[p].supported))
    if not support.accelerated:
        warnings.warn(f"{precision} on this {device_type} is not accelerated ({support.how}); "
                      "expect it to be slower than fp32", UnacceleratedPrecisionWarning, stacklevel=3)
    return support


def _device_precisions(device_type: str) -> dict[str, PrecisionSupport]:
    report = hardware.report()
    if report.device_type == device_type:
        return report.precisions
    if device_type == "cpu":  # asked for the CPU on a machine that also has a GPU
        return hardware.cpu_precisions(hardware.cpu_flags())
    raise ValueError(f"device {device_type!r} is not available here (found {report.device_type})")


def fit_to_hardware(config: RunConfig, seconds: float = 20.0) -> RunConfig:
    """The config, with a time limit when its precision is not accelerated on its device.

    On a CPU without native fp16 arithmetic an fp16 step can take tens of times longer than an
    fp32 step; rather than wait minutes, such a run stops after `seconds` and says so. On a CPU
    a 16-bit precision counts as accelerated only if the calibration also measured it fast
    (`hardware.is_fast`): flags promise nothing when torch's kernels do not use them.
    """
    device = config.resolved_device()
    if config.accelerated(device, _device_precisions(device.type)[config.precision]):
        return config
    return dataclasses.replace(config, time_limit_s=seconds)
