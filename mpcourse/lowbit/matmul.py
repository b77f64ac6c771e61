"""An emulated scaled matmul over block-scaled operands, with the accumulator as a parameter.

A low-precision GEMM multiplies the small elements exactly (an FP8 x FP8 product has at most
8 significant bits) and adds the products in an accumulator. How many bits that accumulator
keeps matters once K is large: DeepSeek-V3 reports that Hopper's FP8 tensor cores keep about
14, which costs up to ~2% relative error at K = 4096, and that promoting the partial sum to an
FP32 accumulator every 128 elements cures it. `Accumulator` describes such an accumulator and
`scaled_matmul(a, b, accumulator)` computes a @ b.T with it; `mpcourse.lowbit.torch_mm` runs
the same product through torch's real scaled GEMMs for comparison.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mpcourse.lowbit.blockscale import Quantized, check_quantized
from mpcourse.numbers.formats import FloatFormat, round_to


@dataclass(frozen=True)
class Accumulator:
    """A running sum that keeps `mantissa_bits` (23 is FP32) and float32's exponent range,
    rounding each addition with `rounding`, and, if `promote_every` is set, adding its partial
    sum into an FP32 accumulator (after applying the block scales) every that many elements.

    `rounding="toward_zero"` models an adder that drops the bits it cannot keep; we assume it for
    Hopper, whose accumulator is undocumented; "nearest_even" is the kinder alternative.
    """
    mantissa_bits: int = 23
    rounding: str = "toward_zero"
    promote_every: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.mantissa_bits, int) or not 1 <= self.mantissa_bits <= 23:
            raise ValueError(f"mantissa_bits must be an integer from 1 to 23 (float32), got "
                             f"{self.mantissa_bits!r}")
        if self.rounding not in ("toward_zero", "nearest_even"):
            raise ValueError(f"rounding must be 'toward_zero' or 'nearest_even', got {self.rounding!r}")
        if self.promote_every is not None and (not isinstance(self.promote_every, int)
                                               or self.promote_every < 1):
            raise ValueError(f"promote_every must be a positive integer or None, got {self.promote_every!r}")

    @property
    def format(self) -> FloatFormat:
        """The accumulator's number format: float32's exponent, `mantissa_bits` of mantissa."""
        return FloatFormat(f"acc_e8m{self.mantissa_bits}", 8, self.mantissa_bits)

    def __str__(self) -> str:
        bits = "FP32" if self.mantissa_bits == 23 else f"{self.mantissa_bits + 1}-bit significand"
        promote = f", promoted to FP32 every {self.promote_every}" if self.promote_every else ""
        return f"{bits} accumulator{promote}"


FP32_ACCUMULATOR = Accumulator()


def scaled_matmul(a: Quantized, b: Quantized,
                  accumulator: Accumulator = FP32_ACCUMULATOR) -> torch.Tensor:
    """a @ b.T for block-scaled a (M x K) and b (N x K), both blocked along K; float32 (M x N).

    Within each stretch of K over which both operands' scales are constant, the element
    products are summed (exactly as `accumulator` would), then multiplied by the two block
    scales and added up in FP32, as an MX or DeepSeek-style GEMM does. An accumulator with
    fewer bits sums `promote_every` products at a time (or all K, for per-tensor and per-row
    scales) before promoting to FP32.
    """
    check_quantized(a, "a"), check_quantized(b, "b")
    if not isinstance(accumulator, Accumulator):
        raise TypeError(f"accumulator must be an Accumulator, got {accumulator!r}")
    k = a.elements.shape[1]
    if b.elements.shape[1] != k:
        raise ValueError(f"a is {tuple(a.elements.shape)} and b is {tuple(b.elements.shape)}: "
                         f"both must have K = {k} columns")
    stretch = math.gcd(_k_block(a), _k_block(b))       # scales constant over each stretch
    scale_a, scale_b = _scales_per_stretch(a, stretch), _scales_per_stretch(b, stretch)
    if accumulator.mantissa_bits == 23 and accumulator.promote_every is None:
        partial = torch.einsum("mbk,nbk->mnb", _stretches(a.elements, stretch),
                               _stretches(b.elements, stretch))
        return (partial * scale_a[:, None, :] * scale_b[None, :, :]).sum(dim=2)
    chunk = accumulator.promote_every or k
    if stretch % chunk:
        raise ValueError(f"the block scales change every {stretch} elements of K; a reduced "
                         f"accumulator must promote at a divisor of that, got "
                         f"promote_every={accumulator.promote_every}")
    total = torch.zeros(a.elements.shape[0], b.elements.shape[0])
    for start in range(0, k, chunk):
        partial = _reduced_sum(a.elements[:, start:start + chunk], b.elements[:, start:start + chunk],
                               accumulator)
        block = start // stretch
        total += partial * scale_a[:, block, None] * scale_b[None, :, block]
    return total


def _reduced_sum(a: torch.Tensor, b: torch.Tensor, accumulator: Accumulator) -> torch.Tensor:
    """Sum a[:, k] * b[:, k] (outer products, each exact) over k, one at a time, rounding the
    running sum to the accumulator's format after every addition."""
    fmt = accumulator.format
    total = torch.zeros(a.shape[0], b.shape[0])
    for k in range(a.shape[1]):
        total = round_to(total + a[:, k, None] * b[None, :, k], fmt, accumulator.rounding)
    return total


def _k_block(q: Quantized) -> int:
    return q.recipe.block[1] or q.elements.shape[1]


def _stretches(elements: torch.Tensor, stretch: int) -> torch.Tensor:
    """(rows, K) as (rows, K / stretch, stretch)."""
    return elements.reshape(elements.shape[0], -1, stretch)


def _scales_per_stretch(q: Quantized, stretch: int) -> torch.Tensor:
    """Each row's full scale for each stretch of K: (rows, K / stretch)."""
    rows = q.recipe.block[0] or q.elements.shape[0]
    per_row = (q.scales * q.tensor_scale).repeat_interleave(rows, 0)
    return per_row.repeat_interleave(_k_block(q) // stretch, 1)
