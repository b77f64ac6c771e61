"""Timing done honestly: warm-up first, synchronize the device, report medians.

A single timing of a GPU or multi-threaded CPU kernel is mostly noise: the first call pays for
allocation, kernel selection and caches, and CUDA calls return before the work is done. Every
speed claim in the course goes through these two functions.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait until queued work on `device` has finished (a no-op on the CPU)."""
    device_type = torch.device(device).type if device is not None else None
    if device_type in (None, "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()
    elif device_type == "mps" and torch.backends.mps.is_available():
        torch.mps.synchronize()


def measure(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 5,
            device: str | torch.device | None = None) -> list[float]:
    """Run `fn` `warmup` times untimed, then `repeats` times timed; return the seconds of each."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


@dataclass(frozen=True)
class Comparison:
    """Medians of A and B measured side by side, and B's time as a multiple of A's."""
    name_a: str
    name_b: str
    seconds_a: float
    seconds_b: float

    @property
    def ratio(self) -> float:
        """How many times longer B took than A (above 1: B is slower)."""
        return self.seconds_b / self.seconds_a

    def __str__(self) -> str:
        return (f"{self.name_a}: {self.seconds_a * 1e3:.3f} ms   {self.name_b}: "
                f"{self.seconds_b * 1e3:.3f} ms   {self.name_b}/{self.name_a} = {self.ratio:.2f}x")


def compare(fn_a: Callable[[], object], fn_b: Callable[[], object], *, name_a: str = "A",
            name_b: str = "B", warmup: int = 2, repeats: int = 7,
            device: str | torch.device | None = None) -> Comparison:
    """Time A against B in alternation, so drift in clock speed or load hits both alike."""
    measure(fn_a, warmup=warmup, repeats=1, device=device)
    measure(fn_b, warmup=warmup, repeats=1, device=device)
    times_a, times_b = [], []
    for _ in range(repeats):
        times_a += measure(fn_a, warmup=0, repeats=1, device=device)
        times_b += measure(fn_b, warmup=0, repeats=1, device=device)
    return Comparison(name_a, name_b, statistics.median(times_a), statistics.median(times_b))
