"""Floating-point formats from the bits up: FP32, FP16, BF16, FP8, and any other you describe.

A binary float stores a sign, an exponent and a mantissa (the fraction bits after an implicit
leading 1). `FloatFormat` derives everything else from the two widths: the bias, the largest
finite value, the smallest normal and subnormal values, machine epsilon.

`round_to(x, fmt)` rounds a float32 tensor to the nearest value `fmt` can hold, using integer
operations on the float32 bit patterns, the way conversion hardware does it. It never calls
torch's own casts; the tests use those casts as the oracle and require equality bit for bit.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

ROUNDING_MODES = ("nearest_even", "toward_zero", "stochastic")
OVERFLOW_MODES = ("inf", "saturate", "nan")

# The float32 layout that round_to works on: 1 sign bit, 8 exponent bits, 23 mantissa bits.
_F32_MANTISSA_BITS = 23
_F32_BIAS = 127
_F32_SIGN = -(2**31)             # 0x80000000 as an int32
_F32_MAGNITUDE = 0x7FFFFFFF
_F32_INF = 0x7F800000
_F32_QUIET_NAN = 0x7FC00000


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, `exponent_bits`, `mantissa_bits`.

    IEEE-style formats (`has_inf=True`) reserve the all-ones exponent for inf and NaN. Formats
    without infinities (`has_inf=False`, like FP8 E4M3 "fn") use that exponent for ordinary
    numbers and keep only the all-ones pattern for NaN, which buys one more binade of range.

    `overflow` says what a finite value too large for the format becomes: "inf" (IEEE, needs
    `has_inf`), "saturate" (the largest finite value, with the sign kept) or "nan". In a format
    without infinities, an infinite input overflows the same way.

    Formats are emulated inside float32, so they can have at most float32's 8 exponent bits
    and 23 mantissa bits.
    """
    name: str
    exponent_bits: int
    mantissa_bits: int
    has_inf: bool = True
    overflow: str | None = None
    torch_dtype: torch.dtype | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.exponent_bits, int) or not 2 <= self.exponent_bits <= 8:
            raise ValueError(f"{self.name}: exponent_bits must be an integer from 2 to 8 (a format "
                             f"needs at least 2 exponent bits to have normal numbers, and at most "
                             f"float32's 8 to be emulated in float32), got {self.exponent_bits!r}")
        lowest_mantissa = 0 if self.has_inf else 1
        if not isinstance(self.mantissa_bits, int) or not lowest_mantissa <= self.mantissa_bits <= 23:
            raise ValueError(f"{self.name}: mantissa_bits must be an integer from {lowest_mantissa} "
                             f"to 23, got {self.mantissa_bits!r}")
        overflow = self.overflow or ("inf" if self.has_inf else "saturate")
        if overflow not in OVERFLOW_MODES:
            raise ValueError(f"{self.name}: unknown overflow {self.overflow!r}; "
                             f"expected one of {OVERFLOW_MODES}")
        if overflow == "inf" and not self.has_inf:
            raise ValueError(f"{self.name}: overflow='inf' needs a format with infinities; "
                             f"use 'saturate' or 'nan'")
        object.__setattr__(self, "overflow", overflow)

    @property
    def bits(self) -> int:
        """Total width in bits."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        """What is subtracted from the stored exponent field to get the power of two."""
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def min_exponent(self) -> int:
        """The power of two of the smallest normal number."""
        return 1 - self.bias

    @property
    def max_exponent(self) -> int:
        """The power of two of the largest finite number."""
        top_field = 2**self.exponent_bits - 1
        return top_field - self.bias - (1 if self.has_inf else 0)

    @property
    def max(self) -> float:
        """The largest finite value."""
        # Without infinities the all-ones mantissa in the top binade is NaN, so step one below it.
        largest_mantissa = 2**self.mantissa_bits - (1 if self.has_inf else 2)
        return math.ldexp(1 + largest_mantissa / 2**self.mantissa_bits, self.max_exponent)

    @property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, self.min_exponent)

    @property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, self.min_exponent - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap between 1.0 and the next representable number."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits the format carries: log10 of 2**(mantissa_bits + 1)."""
        return (self.mantissa_bits + 1) * math.log10(2)

    def __repr__(self) -> str:
        return (f"FloatFormat({self.name!r}, exponent_bits={self.exponent_bits}, "
                f"mantissa_bits={self.mantissa_bits}, has_inf={self.has_inf}, "
                f"overflow={self.overflow!r})")


FP32 = FloatFormat("fp32", 8, 23, torch_dtype=torch.float32)
FP16 = FloatFormat("fp16", 5, 10, torch_dtype=torch.float16)
BF16 = FloatFormat("bf16", 8, 7, torch_dtype=torch.bfloat16)
# torch.float8_e4m3fn: no infinities, max 448; torch 2.13 saturates overflow (and inf) to +/-448.
FP8_E4M3 = FloatFormat("fp8_e4m3", 4, 3, has_inf=False, overflow="saturate",
                       torch_dtype=torch.float8_e4m3fn)
FP8_E5M2 = FloatFormat("fp8_e5m2", 5, 2, torch_dtype=torch.float8_e5m2)
FORMATS = (FP32, FP16, BF16, FP8_E4M3, FP8_E5M2)


def round_to(x: torch.Tensor, fmt: FloatFormat, rounding: str = "nearest_even",
             generator: torch.Generator | None = None,
             random_bits: torch.Tensor | None = None) -> torch.Tensor:
    """Round each element of float32 `x` to a value that `fmt` can hold; return it as float32.

    Keeps the sign (so -0 stays -0), subnormals, infinities and NaN. Values too large for `fmt`
    follow `fmt.overflow`. `rounding` is "nearest_even" (what hardware casts do), "toward_zero"
    (drop the extra bits; finite values then never overflow), or "stochastic" (round up with
    probability equal to the fraction of the gap already covered, so the result is right on
    average; `generator` seeds it).
    Float16 and bfloat16 inputs are accepted (float32 holds them exactly); float64 is not.

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
        torch.bitwise_or(magnitude, chunk & _F32_SIGN, out=rounded[start:start + chunk_size])
    return rounded.view(torch.float32).reshape(x.shape)


_CPU_CHUNK = 1 << 17  # 512 KiB of int32: fits in L2; measured fastest on an idle 2-core machine


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


def _round_magnitude(magnitude: torch.Tensor, fmt: FloatFormat, rounding: str,
                     random: _RandomBits) -> torch.Tensor:
    """Round float32 bit patterns without their sign bit to `fmt`; return the new patterns."""
    # NaN patterns (above inf's) are set aside for the end; rounding inf's pattern keeps it.
    finite_or_inf = magnitude.clamp(max=_F32_INF)
    # Where fmt has normal numbers, its values are the float32 patterns whose low
    # 23 - mantissa_bits bits are clear, so rounding means clearing those bits. A carry out of
    # the mantissa lands in the exponent field, which is exactly the next binade up.
    rounded = _drop_low_bits(finite_or_inf, _F32_MANTISSA_BITS - fmt.mantissa_bits, rounding,
                             random)
    # Below fmt's smallest normal the spacing stops shrinking (those are its subnormals). A
    # format with float32's 8 exponent bits has float32's subnormal spacing: nothing to add.
    smallest_normal = _pattern(fmt.smallest_normal)
    if fmt.exponent_bits < 8 and finite_or_inf.min() < smallest_normal:
        rounded = _select(_flag_above(smallest_normal, finite_or_inf),
                          _round_below_normal(finite_or_inf, fmt, rounding, random), rounded)

    largest = _pattern(fmt.max)
    # Truncation never takes a finite value past the largest one (IEEE 754 agrees).
    overflow_to = largest if rounding == "toward_zero" else {
        "inf": _F32_INF, "saturate": largest, "nan": _F32_QUIET_NAN}[fmt.overflow]
    rounded = _select(_flag_above(rounded, largest), overflow_to, rounded)
    if fmt.has_inf and overflow_to != _F32_INF:   # inf itself is representable: it stays inf
        rounded = _select(_flag_above(magnitude, _F32_INF - 1), _F32_INF, rounded)
    return _select(_flag_above(magnitude, _F32_INF), _F32_QUIET_NAN, rounded)


def _round_below_normal(magnitude: torch.Tensor, fmt: FloatFormat, rounding: str,
                        random: _RandomBits) -> torch.Tensor:
    """Round magnitudes below fmt's smallest normal, where fmt's spacing is its smallest subnormal.

    (Larger magnitudes come out wrong here; the caller keeps only the small ones.)
    """
    # Split each pattern into rest + significand, where the 24-bit significand has the implicit
    # leading 1 made explicit and `rest` carries the exponent. Float32 subnormals (exponent
    # field 0) have no implicit 1 and the spacing of exponent field 1, so they count as field 1.
    exponent_field = (magnitude >> _F32_MANTISSA_BITS).clamp_(min=1)
    rest = (exponent_field - 1) << _F32_MANTISSA_BITS
    significand = magnitude - rest
    # One more bit goes per binade below fmt's smallest normal.
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
        increment = 0
    elif rounding == "stochastic":
        # Uniform in [0, 2**count): the add carries with probability (dropped bits) / 2**count.
        increment = random.draw(bits) & dropped_mask
    else:
        # Nearest, ties to even: half a step minus one, plus the last kept bit, so that a tie
        # carries only from an odd value. (mask + last) >> 1 is exactly that for count >= 1,
        # and 0 when nothing is dropped.
        last_kept_bit = (bits >> count) & 1
        increment = (last_kept_bit + dropped_mask) >> 1
    return (bits + increment) & ~dropped_mask


def _pattern(value: float) -> int:
    """The float32 bit pattern of `value` as a Python int."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


class Bits(NamedTuple):
    """The three fields of a value stored in a format, as unsigned integers."""
    sign: int
    exponent: int
    mantissa: int
    exponent_bits: int
    mantissa_bits: int

    def __str__(self) -> str:
        exponent = format(self.exponent, f"0{self.exponent_bits}b")
        mantissa = format(self.mantissa, f"0{self.mantissa_bits}b") if self.mantissa_bits else ""
        return f"{self.sign} {exponent} {mantissa}".rstrip()


def bits(value: float, fmt: FloatFormat) -> Bits:
    """The sign, exponent and mantissa fields of `value` rounded to `fmt` (nearest even).

    `value` is first stored as float32, as it would be in a tensor.
    """
    stored = _round_scalar(value, fmt)
    sign = int(math.copysign(1.0, stored) < 0)
    top_field = 2**fmt.exponent_bits - 1
    if math.isnan(stored):
        # One NaN encoding: IEEE formats set the quiet bit; "fn" formats have only all ones.
        quiet = 1 << (fmt.mantissa_bits - 1) if fmt.has_inf else 2**fmt.mantissa_bits - 1
        return Bits(sign, top_field, quiet, fmt.exponent_bits, fmt.mantissa_bits)
    if math.isinf(stored):
        return Bits(sign, top_field, 0, fmt.exponent_bits, fmt.mantissa_bits)
    code = round(abs(stored) / fmt.smallest_subnormal)   # exact: stored is on the format's grid
    if abs(stored) < fmt.smallest_normal:
        return Bits(sign, 0, code, fmt.exponent_bits, fmt.mantissa_bits)
    power = math.frexp(abs(stored))[1] - 1
    mantissa = round(math.ldexp(abs(stored), -power) * 2**fmt.mantissa_bits) - 2**fmt.mantissa_bits
    return Bits(sign, power + fmt.bias, mantissa, fmt.exponent_bits, fmt.mantissa_bits)


def from_bits(sign: int, exponent: int, mantissa: int, fmt: FloatFormat) -> float:
    """The value that the fields (sign, exponent, mantissa) encode in `fmt`."""
    top_field = 2**fmt.exponent_bits - 1
    if not (sign in (0, 1) and 0 <= exponent <= top_field and 0 <= mantissa < 2**fmt.mantissa_bits):
        raise ValueError(f"fields ({sign}, {exponent}, {mantissa}) don't fit {fmt.name}: sign 0 or 1, "
                         f"exponent 0..{top_field}, mantissa 0..{2**fmt.mantissa_bits - 1}")
    signed = -1.0 if sign else 1.0
    if fmt.has_inf and exponent == top_field:
        return signed * math.inf if mantissa == 0 else math.nan
    if not fmt.has_inf and exponent == top_field and mantissa == 2**fmt.mantissa_bits - 1:
        return math.nan
    if exponent == 0:
        return signed * mantissa * fmt.smallest_subnormal
    return signed * math.ldexp(1 + mantissa / 2**fmt.mantissa_bits, exponent - fmt.bias)


def neighbours(value: float, fmt: FloatFormat) -> tuple[float, float]:
    """The representable values just below and just above `value` rounded to `fmt`.

    Past the largest finite value the next one up is inf (or nan where `fmt` has no inf).
    """
    stored = _round_scalar(value, fmt)
    if math.isnan(stored):
        return math.nan, math.nan
    return _step(stored, fmt, -1), _step(stored, fmt, +1)


def _step(stored: float, fmt: FloatFormat, direction: int) -> float:
    """The next value of `fmt` from `stored` (on the grid) toward +inf (+1) or -inf (-1)."""
    if math.isinf(stored):
        return fmt.max * math.copysign(1.0, stored) if direction * stored < 0 else stored
    if stored == 0:
        return direction * fmt.smallest_subnormal
    field = bits(stored, fmt)
    code = (field.exponent << fmt.mantissa_bits) + field.mantissa
    code += 1 if (stored > 0) == (direction > 0) else -1
    exponent, mantissa = divmod(code, 2**fmt.mantissa_bits)
    return from_bits(field.sign, exponent, mantissa, fmt)


def grid(fmt: FloatFormat, low: float, high: float) -> list[float]:
    """Every finite value of `fmt` in [low, high], in increasing order."""
    if not low <= high:
        raise ValueError(f"grid needs low <= high, got low={low}, high={high}")
    value = _round_scalar(low, fmt)
    if value < low:
        value = _step(value, fmt, +1)
    values = []
    while value <= high and math.isfinite(value):
        values.append(value)
        value = _step(value, fmt, +1)
    return values


@dataclass(frozen=True)
class Explanation:
    """What happens to one number stored in one format (rounded to nearest even)."""
    value: float
    fmt: FloatFormat
    stored: float
    bits: Bits
    below: float
    above: float

    @property
    def kind(self) -> str:
        """'zero', 'subnormal', 'normal', 'inf' or 'nan'."""
        if math.isnan(self.stored):
            return "nan"
        if math.isinf(self.stored):
            return "inf"
        if self.stored == 0:
            return "zero"
        return "subnormal" if self.bits.exponent == 0 else "normal"

    @property
    def exponent(self) -> int | None:
        """The power of two the stored bits encode (None for zero, inf and nan)."""
        if self.kind == "normal":
            return self.bits.exponent - self.fmt.bias
        return self.fmt.min_exponent if self.kind == "subnormal" else None

    @property
    def relative_error(self) -> float:
        """|stored - value| / |value|: 0 when exact, inf on overflow, nan for nan."""
        if math.isnan(self.value) or math.isnan(self.stored):
            return math.nan
        if self.stored == self.value:
            return 0.0
        if math.isinf(self.value):
            return math.inf
        return abs(self.stored - self.value) / abs(self.value)

    @property
    def formula(self) -> str:
        """How the fields make the stored value, e.g. '(1 + 614/1024) x 2**-4'."""
        fields, scale = self.bits, 2**self.fmt.mantissa_bits
        sign = "-" if fields.sign else ""
        if self.kind == "normal":
            return f"{sign}(1 + {fields.mantissa}/{scale}) x 2**{self.exponent}"
        if self.kind == "subnormal":
            return f"{sign}({fields.mantissa}/{scale}) x 2**{self.exponent}"
        return {"zero": f"{sign}0", "inf": f"{sign}inf", "nan": "nan"}[self.kind]

    def __str__(self) -> str:
        fields, fmt = self.bits, self.fmt
        top = 2**fmt.exponent_bits - 1
        exponent = {
            "normal": f"field {fields.exponent} - bias {fmt.bias} = {self.exponent}",
            "subnormal": f"field 0: subnormal, no implicit 1, exponent fixed at {self.exponent}",
            "zero": "field 0 with mantissa 0: zero",
            "inf": f"field {top} (all ones) with mantissa 0: infinity",
            "nan": f"field {top} (all ones) with this mantissa: not a number",
        }[self.kind]
        return "\n".join([
            f"{self.value!r} stored in {fmt.name} "
            f"(1 sign, {fmt.exponent_bits} exponent, {fmt.mantissa_bits} mantissa bits)",
            f"  bits        {fields.sign} | {format(fields.exponent, f'0{fmt.exponent_bits}b')} | "
            f"{format(fields.mantissa, f'0{fmt.mantissa_bits}b') if fmt.mantissa_bits else '-'}",
            f"  exponent    {exponent}",
            f"  value       {self.formula} = {self.stored!r}",
            f"  neighbours  {self.below!r} below, {self.above!r} above",
            f"  rel. error  {self.relative_error:.3g}",
        ])

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))


def explain(value: float, fmt: FloatFormat) -> Explanation:
    """Store `value` in `fmt` and describe the result: fields, exponent, neighbours, error.

    `value` is first stored as float32 (as in a tensor); the error is measured against `value`
    itself, so for FP32 it shows float32's own rounding.
    """
    value = float(value)
    below, above = neighbours(value, fmt)
    return Explanation(value, fmt, _round_scalar(value, fmt), bits(value, fmt), below, above)


def _round_scalar(value: float, fmt: FloatFormat) -> float:
    return round_to(torch.tensor([float(value)], dtype=torch.float32), fmt).item()
