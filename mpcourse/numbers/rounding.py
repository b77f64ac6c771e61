"""Rounding a float32 tensor to a smaller format with integer operations on its bit patterns.

`round_to(x, fmt)` is what a conversion unit does: take each float32 pattern, add an increment
to the bits that will be dropped, let a carry ripple into the kept bits, clear the dropped bits.
It never calls torch's casts; the tests use those casts (and the `ml_dtypes` package) as the
oracle and require equality bit for bit. It builds on `mpcourse.numbers.float_format`, which
describes the formats; `mpcourse.numbers.formats` hands on both.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

import torch

from mpcourse.numbers.float_format import ROUNDING_MODES, FloatFormat, as_format

__all__ = ["round_to", "ROUNDING_MODES"]

# The float32 layout that round_to works on: 1 sign bit, 8 exponent bits, 23 mantissa bits.
_F32_MANTISSA_BITS = 23
_F32_BIAS = 127
_F32_SIGN = -(2**31)             # 0x80000000 as an int32
_F32_MAGNITUDE = 0x7FFFFFFF
_F32_SMALLEST_NORMAL = 0x00800000
_F32_INF = 0x7F800000
_F32_QUIET_NAN = 0x7FC00000
_CPU_CHUNK = 1 << 17  # 512 KiB of int32: fits in L2; measured fastest on an idle 2-core machine


def round_to(x: torch.Tensor, fmt: FloatFormat | torch.dtype | str, rounding: str | None = None,
             generator: torch.Generator | None = None,
             random_bits: torch.Tensor | None = None) -> torch.Tensor:
    """Round each element of float32 `x` to a value that `fmt` can hold; return it as float32.

    Keeps the sign (so -0 stays -0, except in formats without a negative zero), subnormals,
    infinities and NaN. Values too large for `fmt` follow `fmt.overflow`. An unsigned format
    drops the sign (torch's e8m0 convention); a format without zero gives its smallest value
    for anything smaller. A format without NaN still returns NaN for a NaN input (float32 can
    say what the format cannot).

    `rounding` is "nearest_even" (what most hardware casts do), "nearest_away" (ties away from
    zero, as torch's e8m0 cast does), "toward_zero" (drop the extra bits; finite values then
    never overflow), or "stochastic" (round up with probability equal to the fraction of the
    gap already covered, so the result is right on average; `generator` seeds it). By default
    it is `fmt.rounding`, the rounding of the format's own cast.
    Float16 and bfloat16 inputs are accepted (float32 holds them exactly); float64 is not.
    `fmt` may also be given as a torch dtype or a name (`torch.bfloat16`, "bf16"; see `as_format`).

    `random_bits` (stochastic only): an int32 tensor of x's shape that supplies the random bits
    instead of drawing them from `generator`, so that a stochastic rounding can be replayed
    bit for bit. Where `d` low bits of the float32 pattern are dropped (at most 24), the
    increment added before clearing them is `random_bits & (2**d - 1)`: for BF16 on normal
    values that is exactly `(bits + (r & 0xFFFF)) & ~0xFFFF`. Below half the smallest
    subnormal, where the result is 0 or the smallest subnormal, the low 25 bits of r are the
    top 25 bits of the increment and the increment's bits below them count as ones. Either way,
    all-zero random bits round toward zero and all-ones round every inexact value away from it.
    Without `random_bits`, each element draws 25 uniform bits from `generator`: once where the
    result is normal in fmt, so the same 25 bits supplied as `random_bits` give the same result.
    """
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        kind = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"round_to needs a floating-point tensor, got {kind}")
    if x.dtype == torch.float64:
        raise ValueError("round_to works on float32 bit patterns and got float64; convert with "
                         "x.float() first (that itself rounds each value to float32)")
    fmt = as_format(fmt)
    rounding = fmt.rounding if rounding is None else rounding
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {ROUNDING_MODES}")
    supplied = None if random_bits is None else _check_random_bits(random_bits, x, rounding,
                                                                    generator).reshape(-1)

    patterns = x.float().contiguous().view(torch.int32).reshape(-1)
    rounded = torch.empty_like(patterns)
    # On the CPU, go through big tensors in chunks: every step below makes a temporary tensor,
    # and chunks keep those temporaries in cache, which makes the whole thing several times faster.
    chunk_size = _CPU_CHUNK if patterns.device.type == "cpu" else max(patterns.numel(), 1)
    for start in range(0, patterns.numel(), chunk_size):
        chunk = patterns[start:start + chunk_size]
        random = _RandomBits(generator, None if supplied is None
                             else supplied[start:start + chunk_size])
        magnitude = _round_magnitude(chunk & _F32_MAGNITUDE, fmt, rounding, random)
        out = rounded[start:start + chunk_size]
        if not fmt.signed:
            out.copy_(magnitude)
        elif fmt.nan == "negative_zero":   # its -0 code is NaN: a result of zero is +0
            torch.bitwise_or(magnitude, (chunk & _F32_SIGN) * magnitude.clamp(max=1), out=out)
        else:
            torch.bitwise_or(magnitude, chunk & _F32_SIGN, out=out)
    return rounded.view(torch.float32).reshape(x.shape)


def _check_random_bits(random_bits, x: torch.Tensor, rounding: str,
                       generator: torch.Generator | None) -> torch.Tensor:
    """`random_bits` as a contiguous int32 tensor, after checking that it fits the call."""
    if rounding != "stochastic":
        raise ValueError(f"random_bits is only used by rounding='stochastic', got {rounding!r}")
    if generator is not None:
        raise ValueError("give either random_bits or generator, not both")
    if not isinstance(random_bits, torch.Tensor) or random_bits.dtype != torch.int32:
        kind = random_bits.dtype if isinstance(random_bits, torch.Tensor) else type(random_bits).__name__
        raise ValueError(f"random_bits must be an int32 tensor, got {kind}")
    if random_bits.shape != x.shape or random_bits.device != x.device:
        raise ValueError(f"random_bits must have x's shape {tuple(x.shape)} on {x.device}, got "
                         f"{tuple(random_bits.shape)} on {random_bits.device}")
    return random_bits.contiguous()


class _RandomBits(NamedTuple):
    """Where stochastic rounding gets its random bits: supplied ones, or fresh draws."""
    generator: torch.Generator | None
    supplied: torch.Tensor | None

    def draw(self, like: torch.Tensor) -> torch.Tensor:
        """Random int32 bits for each element of `like`: the supplied ones, or 25 fresh bits."""
        if self.supplied is not None:
            return self.supplied
        return torch.randint(0, 1 << 25, like.shape, generator=self.generator, dtype=torch.int32,
                             device=like.device)

    def subset(self, index: torch.Tensor) -> "_RandomBits":
        """The random bits of the elements at `index` (fresh draws stay fresh draws)."""
        return _RandomBits(self.generator, None if self.supplied is None else self.supplied[index])


def _round_magnitude(magnitude: torch.Tensor, fmt: FloatFormat, rounding: str,
                     random: _RandomBits) -> torch.Tensor:
    """Round float32 bit patterns without their sign bit to `fmt`; return the new patterns.

    The special cases (NaN, inf, overflow, fmt's subnormals) cost whole passes over the data,
    so each runs only when the chunk holds such values: its smallest and largest patterns tell.
    """
    if not magnitude.numel():
        return magnitude.clone()
    low, top = (int(v) for v in torch.aminmax(magnitude))
    # NaN patterns (above inf's) are set aside for the end; rounding inf's pattern keeps it.
    finite_or_inf = magnitude.clamp(max=_F32_INF) if top > _F32_INF else magnitude
    # Where fmt has normal numbers, its values are the float32 patterns whose low
    # 23 - mantissa_bits bits are clear, so rounding means clearing those bits. A carry out of
    # the mantissa lands in the exponent field, which is exactly the next binade up.
    rounded = _drop_low_bits(finite_or_inf, _F32_MANTISSA_BITS - fmt.mantissa_bits, rounding,
                             random)
    # Below fmt's smallest normal the spacing stops shrinking (those are its subnormals), and
    # below float32's own smallest normal float32 patterns have no implicit 1: both need the
    # slower path, taken only by the few elements that are that small. A format whose normals
    # start where float32's do needs neither.
    if fmt.min_exponent != 1 - _F32_BIAS:
        below = max(_pattern(fmt.smallest_normal), _F32_SMALLEST_NORMAL)
        # E8M0 (no zero, 2**-127 and up) rounds float32 subnormals to the nearest power of two
        # by value, as ml_dtypes 0.7 does; torch 2.13's cast rounds those above 2**-127 up
        # to 2**-126 (see FP8_E8M0). Anything below 2**-127 becomes 2**-127 at the end.
        if low < below:
            small = (finite_or_inf < below).nonzero().squeeze(1)
            rounded[small] = _round_below_normal(finite_or_inf[small], fmt, rounding,
                                                 random.subset(small))

    largest = _pattern(fmt.max)
    # Truncation never takes a finite value past the largest one (IEEE 754 agrees).
    overflow_to = largest if rounding == "toward_zero" else {
        "inf": _F32_INF, "saturate": largest, "nan": _F32_QUIET_NAN}[fmt.overflow]
    if top > largest:
        rounded = _select(_flag_above(rounded, largest), overflow_to, rounded)
        if fmt.has_inf and overflow_to != _F32_INF:   # inf itself is representable: it stays inf
            rounded = _select(_flag_above(magnitude, _F32_INF - 1), _F32_INF, rounded)
    if not fmt.has_zero:                              # nothing lies below the smallest value
        rounded = rounded.clamp_(min=_pattern(fmt.smallest_subnormal))
    if top > _F32_INF:
        rounded = _select(_flag_above(magnitude, _F32_INF), _F32_QUIET_NAN, rounded)
    return rounded


def _round_below_normal(magnitude: torch.Tensor, fmt: FloatFormat, rounding: str,
                        random: _RandomBits) -> torch.Tensor:
    """Round magnitudes below fmt's smallest normal, where fmt's spacing is its smallest
    subnormal, and (for formats reaching below float32's normals) float32's subnormals.

    (Magnitudes above both come out wrong here; the caller keeps only the small ones.)
    """
    # Split each pattern into rest + significand, where the 24-bit significand has the implicit
    # leading 1 made explicit and `rest` carries the exponent. Float32 subnormals (exponent
    # field 0) have no implicit 1 and the spacing of exponent field 1, so they count as field 1.
    exponent_field = (magnitude >> _F32_MANTISSA_BITS).clamp_(min=1)
    rest = (exponent_field - 1) << _F32_MANTISSA_BITS
    significand = magnitude - rest
    # One more bit goes per binade below fmt's smallest normal (one fewer for float32's
    # subnormals when fmt's smallest normal is 2**-127, half float32's).
    binades_below = (fmt.min_exponent + _F32_BIAS) - exponent_field
    dropped = (binades_below + _F32_MANTISSA_BITS - fmt.mantissa_bits).clamp_(min=0)
    rounded = _drop_low_bits(significand, dropped.clamp(max=24), rounding, random)
    # A carry out of the significand bumps the exponent in `rest`, as above; a significand
    # rounded away entirely leaves zero, whatever its exponent was.
    rounded = rest.mul_(rounded.clamp(max=1)).add_(rounded)
    # Dropping 25 or more bits leaves below half the smallest subnormal: nearest and toward-zero
    # give 0, and stochastic rounding gives the smallest subnormal with probability
    # magnitude / smallest subnormal. It adds 25 random bits to the top 25 dropped bits and
    # rounds up on a carry; the dropped bits below those are rounded up into them (as if the
    # increment's lowest bits were ones), so that random bits of all ones round any nonzero
    # value up, and all zeros round it down.
    up = 0
    if rounding == "stochastic":
        shift = (dropped - 25).clamp_(min=0, max=30)   # past 30 only "nonzero or not" is left
        top_bits = (significand + (1 << shift) - 1) >> shift
        up = (top_bits + (random.draw(magnitude) & ((1 << 25) - 1))) >> 25
    return _select(_flag_above(dropped, 24), up * _pattern(fmt.smallest_subnormal), rounded)


def _flag_above(x: torch.Tensor | int, limit: torch.Tensor | int) -> torch.Tensor:
    """1 where x > limit, else 0 (both non-negative int32)."""
    return (x - limit).clamp_(min=0, max=1)


def _select(flag: torch.Tensor, chosen: torch.Tensor | int, otherwise: torch.Tensor) -> torch.Tensor:
    """`chosen` where flag is 1, `otherwise` where it is 0: a branch-free select, as in hardware.

    (torch.where says the same, but on the CPU it is several times slower than this.)
    """
    return otherwise + flag * (chosen - otherwise)


def _drop_low_bits(bits: torch.Tensor, count: int | torch.Tensor, rounding: str,
                   random: _RandomBits) -> torch.Tensor:
    """Clear the low `count` bits of each integer, rounding the value they held away.

    Rounding adds an increment before clearing: the add carries into the kept bits exactly
    when the value should go up.
    """
    dropped_mask = (1 << count) - 1
    if rounding == "toward_zero":
        return bits & ~dropped_mask
    if rounding == "stochastic":
        # Uniform in [0, 2**count): the add carries with probability (dropped bits) / 2**count.
        increment = random.draw(bits) & dropped_mask
    elif rounding == "nearest_away":
        # Half a step: a tie carries. (mask + 1) >> 1 is exactly that, and 0 when nothing is dropped.
        return (bits + ((dropped_mask + 1) >> 1)).bitwise_and_(~dropped_mask)
    else:
        # Nearest, ties to even: half a step minus one, plus the last kept bit, so that a tie
        # carries only from an odd value. (mask + last) >> 1 is exactly that for count >= 1,
        # and 0 when nothing is dropped. (In place, to spare the memory traffic of temporaries.)
        increment = (bits >> count).bitwise_and_(1).add_(dropped_mask).bitwise_right_shift_(1)
    return increment.add_(bits).bitwise_and_(~dropped_mask)


def _pattern(value: float) -> int:
    """The float32 bit pattern of `value` as a Python int."""
    return struct.unpack("<i", struct.pack("<f", value))[0]
