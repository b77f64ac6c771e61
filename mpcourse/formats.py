"""Floating-point formats from the bits up: FP32, FP16, BF16, FP8, FP6, FP4, E8M0, and any other.

A binary float stores a sign, an exponent and a mantissa (the fraction bits after an implicit
leading 1). `FloatFormat` derives everything else from a few choices that real formats make
differently: the widths, the exponent bias, whether there is a sign, a zero, infinities, and
where NaN lives. From those follow the largest finite value, the smallest normal and subnormal
values, machine epsilon.

`round_to(x, fmt)` (from `mpcourse.rounding`) rounds a float32 tensor to the nearest value
`fmt` can hold, with integer operations on the float32 bit patterns, the way conversion
hardware does it. `bits`, `from_bits`, `neighbours`, `grid` and `explain` look at one value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from mpcourse.rounding import ROUNDING_MODES, round_to

__all__ = ["FloatFormat", "round_to", "ROUNDING_MODES", "OVERFLOW_MODES", "NAN_ENCODINGS",
           "FP32", "FP16", "BF16", "FP8_E4M3", "FP8_E5M2", "FP8_E4M3FNUZ", "FP8_E5M2FNUZ",
           "FP8_E8M0", "FP6_E2M3", "FP6_E3M2", "FP4_E2M1", "TF32", "FORMATS", "ALL_FORMATS",
           "Bits", "bits", "from_bits", "neighbours", "grid", "Explanation", "explain"]

OVERFLOW_MODES = ("inf", "saturate", "nan")
# Where a format keeps NaN: "ieee" (all-ones exponent with a nonzero mantissa; needs
# infinities), "top" (only the all-ones code: FP8 E4M3 "fn", E8M0), "negative_zero" (the
# code of -0: the "fnuz" formats), or "none" (FP6 and FP4 of the MX spec).
NAN_ENCODINGS = ("ieee", "top", "negative_zero", "none")


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: a sign bit, `exponent_bits`, `mantissa_bits`.

    IEEE-style formats (`has_inf=True`) reserve the all-ones exponent for inf and NaN. Formats
    without infinities (`has_inf=False`) use that exponent for ordinary numbers and keep NaN
    where `nan` says, which buys one more binade of range.

    `overflow` says what a finite value too large for the format becomes: "inf" (IEEE, needs
    `has_inf`), "saturate" (the largest finite value, with the sign kept) or "nan" (needs a
    NaN). In a format without infinities, an infinite input overflows the same way.

    The rest are for formats that differ from IEEE more: `bias` (default 2**(exponent_bits-1)
    - 1; the fnuz formats add one), `signed=False` (no sign bit: E8M0), `has_zero=False` (no
    zero and no subnormals: exponent field 0 is an ordinary binade, as in E8M0), and
    `rounding`, the rounding of the format's own cast (torch's E8M0 cast breaks ties upward).

    Formats are emulated inside float32, so every value must be a float32 value: at most 23
    mantissa bits, exponents from -127 to 127, nothing smaller than 2**-149.
    """
    name: str
    exponent_bits: int
    mantissa_bits: int
    has_inf: bool = True
    overflow: str | None = None
    torch_dtype: torch.dtype | None = field(default=None, compare=False)
    bias: int | None = None
    signed: bool = True
    has_zero: bool = True
    nan: str | None = None
    rounding: str = "nearest_even"

    def __post_init__(self) -> None:
        if not isinstance(self.exponent_bits, int) or not 2 <= self.exponent_bits <= 8:
            raise ValueError(f"{self.name}: exponent_bits must be an integer from 2 to 8 (a format "
                             f"needs at least 2 exponent bits to have normal numbers, and at most "
                             f"float32's 8 to be emulated in float32), got {self.exponent_bits!r}")
        nan = self.nan or ("ieee" if self.has_inf else "top")
        if nan not in NAN_ENCODINGS:
            raise ValueError(f"{self.name}: unknown nan {self.nan!r}; expected one of {NAN_ENCODINGS}")
        if (nan == "ieee") != self.has_inf:
            raise ValueError(f"{self.name}: nan='ieee' goes with has_inf=True and only with it "
                             f"(got nan={nan!r}, has_inf={self.has_inf})")
        lowest_mantissa = 1 if nan == "ieee" else 0   # IEEE tells NaN from inf by the mantissa
        if not isinstance(self.mantissa_bits, int) or not lowest_mantissa <= self.mantissa_bits <= 23:
            raise ValueError(f"{self.name}: mantissa_bits must be an integer from {lowest_mantissa} "
                             f"to 23, got {self.mantissa_bits!r}")
        if nan == "negative_zero" and not self.signed:
            raise ValueError(f"{self.name}: nan='negative_zero' needs a sign bit")
        overflow = self.overflow or ("inf" if self.has_inf else "saturate")
        if overflow not in OVERFLOW_MODES:
            raise ValueError(f"{self.name}: unknown overflow {self.overflow!r}; "
                             f"expected one of {OVERFLOW_MODES}")
        if overflow == "inf" and not self.has_inf:
            raise ValueError(f"{self.name}: overflow='inf' needs a format with infinities; "
                             f"use 'saturate' or 'nan'")
        if overflow == "nan" and nan == "none":
            raise ValueError(f"{self.name}: overflow='nan' needs a format with a NaN; use 'saturate'")
        if self.rounding not in ROUNDING_MODES:
            raise ValueError(f"{self.name}: unknown rounding {self.rounding!r}; "
                             f"expected one of {ROUNDING_MODES}")
        object.__setattr__(self, "overflow", overflow)
        object.__setattr__(self, "nan", nan)
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (self.exponent_bits - 1) - 1)
        if not isinstance(self.bias, int):
            raise ValueError(f"{self.name}: bias must be an integer, got {self.bias!r}")
        smallest_power = self.min_exponent - (self.mantissa_bits if self.has_zero else 0)
        if not (self.min_exponent >= -127 and self.max_exponent <= 127 and smallest_power >= -149):
            raise ValueError(f"{self.name}: bias {self.bias} puts values outside float32 (powers "
                             f"of two from 2**{smallest_power} to 2**{self.max_exponent}; float32 "
                             f"emulation allows normals from 2**-127 to 2**127, nothing below 2**-149)")

    @property
    def bits(self) -> int:
        """Total width in bits."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def min_exponent(self) -> int:
        """The power of two of the smallest normal number."""
        return (1 if self.has_zero else 0) - self.bias

    @property
    def max_exponent(self) -> int:
        """The power of two of the largest finite number."""
        return (self.largest_code >> self.mantissa_bits) - self.bias

    @property
    def largest_code(self) -> int:
        """The code (exponent and mantissa fields, without the sign) of the largest finite value."""
        all_ones = 2 ** (self.exponent_bits + self.mantissa_bits) - 1
        if self.has_inf:                     # the whole top binade is inf and NaN
            return all_ones - 2**self.mantissa_bits
        return all_ones - (1 if self.nan == "top" else 0)

    @property
    def max(self) -> float:
        """The largest finite value."""
        return self.code_value(self.largest_code)

    @property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, self.min_exponent)

    @property
    def smallest_subnormal(self) -> float:
        """The smallest positive value (a format without zero has no subnormals: its smallest normal)."""
        return math.ldexp(1.0, self.min_exponent - (self.mantissa_bits if self.has_zero else 0))

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap between 1.0 and the next representable number."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits the format carries: log10 of 2**(mantissa_bits + 1)."""
        return (self.mantissa_bits + 1) * math.log10(2)

    def code_value(self, code: int) -> float:
        """The magnitude that a finite code (exponent and mantissa fields, no sign) encodes."""
        exponent, mantissa = divmod(code, 2**self.mantissa_bits)
        if exponent == 0 and self.has_zero:
            return math.ldexp(mantissa, self.min_exponent - self.mantissa_bits)
        return math.ldexp(1 + mantissa / 2**self.mantissa_bits, exponent - self.bias)

    def __repr__(self) -> str:
        text = (f"FloatFormat({self.name!r}, exponent_bits={self.exponent_bits}, "
                f"mantissa_bits={self.mantissa_bits}, has_inf={self.has_inf}, "
                f"overflow={self.overflow!r}")
        defaults = FloatFormat("default", self.exponent_bits, self.mantissa_bits, self.has_inf)
        for name in ("bias", "signed", "has_zero", "nan", "rounding"):
            if getattr(self, name) != getattr(defaults, name):
                text += f", {name}={getattr(self, name)!r}"
        return text + ")"


FP32 = FloatFormat("fp32", 8, 23, torch_dtype=torch.float32)
FP16 = FloatFormat("fp16", 5, 10, torch_dtype=torch.float16)
BF16 = FloatFormat("bf16", 8, 7, torch_dtype=torch.bfloat16)
# torch.float8_e4m3fn: no infinities, max 448; torch 2.13 saturates overflow (and inf) to +/-448.
FP8_E4M3 = FloatFormat("fp8_e4m3", 4, 3, has_inf=False, overflow="saturate",
                       torch_dtype=torch.float8_e4m3fn)
FP8_E5M2 = FloatFormat("fp8_e5m2", 5, 2, torch_dtype=torch.float8_e5m2)
FORMATS = (FP32, FP16, BF16, FP8_E4M3, FP8_E5M2)

# The "fnuz" FP8 formats (AMD MI300, Graphcore): no inf, no -0 (its code is the one NaN), the
# bias one higher than IEEE's. Torch turns overflow and inf into NaN.
FP8_E4M3FNUZ = FloatFormat("fp8_e4m3fnuz", 4, 3, has_inf=False, overflow="nan", bias=8,
                           nan="negative_zero", torch_dtype=torch.float8_e4m3fnuz)
FP8_E5M2FNUZ = FloatFormat("fp8_e5m2fnuz", 5, 2, has_inf=False, overflow="nan", bias=16,
                           nan="negative_zero", torch_dtype=torch.float8_e5m2fnuz)
# The MX block scale: a bare power of two, 2**-127 to 2**127, code 0xFF is NaN. Torch's cast
# drops the sign, gives 2**-127 for zero, rounds ties up, and turns overflow and inf into NaN.
FP8_E8M0 = FloatFormat("fp8_e8m0", 8, 0, has_inf=False, overflow="nan", signed=False,
                       has_zero=False, rounding="nearest_away", torch_dtype=torch.float8_e8m0fnu)
# The MX spec's FP6 and FP4 elements: no inf, no NaN; overflow saturates (torch has no dtype
# for FP6; its float4_e2m1fn_x2 packs two FP4 codes per byte and has no cast).
FP6_E2M3 = FloatFormat("fp6_e2m3", 2, 3, has_inf=False, nan="none")
FP6_E3M2 = FloatFormat("fp6_e3m2", 3, 2, has_inf=False, nan="none")
FP4_E2M1 = FloatFormat("fp4_e2m1", 2, 1, has_inf=False, nan="none")
ALL_FORMATS = FORMATS + (FP8_E4M3FNUZ, FP8_E5M2FNUZ, FP8_E8M0, FP6_E2M3, FP6_E3M2, FP4_E2M1)

# TF32: what an NVIDIA tensor core (Ampere and newer) reads from an FP32 operand when TF32 math
# is on. FP32's 8 exponent bits and range, FP16's 10 mantissa bits: rounding to it keeps the top
# 10 of FP32's 23 mantissa bits. It is not a storage format: the values stay in FP32 registers
# and memory, so torch has no dtype for it, and it stays out of FORMATS and ALL_FORMATS, whose
# tables and plots show the formats a tensor is stored in.
TF32 = FloatFormat("tf32", 8, 10)


class Bits(NamedTuple):
    """The three fields of a value stored in a format, as unsigned integers."""
    sign: int
    exponent: int
    mantissa: int
    exponent_bits: int
    mantissa_bits: int
    signed: bool = True

    def __str__(self) -> str:
        exponent = format(self.exponent, f"0{self.exponent_bits}b")
        mantissa = format(self.mantissa, f"0{self.mantissa_bits}b") if self.mantissa_bits else ""
        sign = f"{self.sign} " if self.signed else ""
        return f"{sign}{exponent} {mantissa}".rstrip()


def bits(value: float, fmt: FloatFormat) -> Bits:
    """The sign, exponent and mantissa fields of `value` rounded to `fmt` (by fmt's own cast).

    `value` is first stored as float32, as it would be in a tensor. An unsigned format has
    sign 0. A NaN gets the format's one NaN code (IEEE formats: the quiet NaN).
    """
    stored = _round_scalar(value, fmt)

    def fields(sign: int, exponent: int, mantissa: int) -> Bits:
        return Bits(sign, exponent, mantissa, fmt.exponent_bits, fmt.mantissa_bits, fmt.signed)

    sign = int(math.copysign(1.0, stored) < 0) if fmt.signed else 0
    top_field = 2**fmt.exponent_bits - 1
    if math.isnan(stored):
        if fmt.nan == "none":
            raise ValueError(f"{fmt.name} has no NaN, so {value!r} has no bits in it")
        if fmt.nan == "negative_zero":
            return fields(1, 0, 0)
        quiet = 1 << (fmt.mantissa_bits - 1) if fmt.nan == "ieee" else 2**fmt.mantissa_bits - 1
        return fields(sign, top_field, quiet)
    if math.isinf(stored):
        return fields(sign, top_field, 0)
    if abs(stored) < fmt.smallest_normal:   # zero or a subnormal: a multiple of the smallest
        return fields(sign, 0, round(abs(stored) / fmt.smallest_subnormal))
    power = math.frexp(abs(stored))[1] - 1
    mantissa = round(math.ldexp(abs(stored), -power) * 2**fmt.mantissa_bits) - 2**fmt.mantissa_bits
    return fields(sign, power + fmt.bias, mantissa)


def from_bits(sign: int, exponent: int, mantissa: int, fmt: FloatFormat) -> float:
    """The value that the fields (sign, exponent, mantissa) encode in `fmt`."""
    top_field = 2**fmt.exponent_bits - 1
    signs = (0, 1) if fmt.signed else (0,)
    if not (sign in signs and 0 <= exponent <= top_field and 0 <= mantissa < 2**fmt.mantissa_bits):
        raise ValueError(f"fields ({sign}, {exponent}, {mantissa}) don't fit {fmt.name}: sign "
                         f"{' or '.join(map(str, signs))}, exponent 0..{top_field}, "
                         f"mantissa 0..{2**fmt.mantissa_bits - 1}")
    signed = -1.0 if sign else 1.0
    code = (exponent << fmt.mantissa_bits) + mantissa
    if fmt.has_inf and exponent == top_field:
        return signed * math.inf if mantissa == 0 else math.nan
    if (fmt.nan == "top" and code == 2 ** (fmt.exponent_bits + fmt.mantissa_bits) - 1
            or fmt.nan == "negative_zero" and sign == 1 and code == 0):
        return math.nan
    return signed * fmt.code_value(code)


def neighbours(value: float, fmt: FloatFormat) -> tuple[float, float]:
    """The representable values just below and just above `value` rounded to `fmt`.

    Past the largest finite value the next one up is inf (or nan where `fmt` has no inf);
    below an unsigned format's smallest value there is nothing (nan).
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
        return direction * fmt.smallest_subnormal if fmt.signed or direction > 0 else math.nan
    field = bits(stored, fmt)
    code = (field.exponent << fmt.mantissa_bits) + field.mantissa
    code += 1 if (stored > 0) == (direction > 0) else -1
    if code < 0 or code == 0 and not fmt.has_zero:   # below the smallest value of an unsigned format
        return math.nan
    if code > fmt.largest_code and not fmt.has_inf:   # past the largest: only NaN, if anything
        return math.nan
    if code == 0 and fmt.nan == "negative_zero":      # zero from below is +0: -0's code is NaN
        return 0.0
    exponent, mantissa = divmod(code, 2**fmt.mantissa_bits)
    return from_bits(field.sign, exponent, mantissa, fmt)


def grid(fmt: FloatFormat, low: float, high: float) -> list[float]:
    """Every finite value of `fmt` in [low, high], in increasing order."""
    if not low <= high:
        raise ValueError(f"grid needs low <= high, got low={low}, high={high}")
    lowest = -fmt.max if fmt.signed else (0.0 if fmt.has_zero else fmt.smallest_subnormal)
    value = _round_scalar(max(low, lowest), fmt)
    if value < low:
        value = _step(value, fmt, +1)
    values = []
    while value <= high and math.isfinite(value):
        values.append(value)
        value = _step(value, fmt, +1)
    return values


@dataclass(frozen=True)
class Explanation:
    """What happens to one number stored in one format (rounded by the format's own cast)."""
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
        return "subnormal" if self.bits.exponent == 0 and self.fmt.has_zero else "normal"

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
            "nan": ("the code of -0: not a number" if fmt.nan == "negative_zero"
                    else f"field {top} (all ones) with this mantissa: not a number"),
        }[self.kind]
        return "\n".join([
            f"{self.value!r} stored in {fmt.name} "
            f"({'1 sign, ' if fmt.signed else 'no sign, '}{fmt.exponent_bits} exponent, "
            f"{fmt.mantissa_bits} mantissa bits)",
            f"  bits        {f'{fields.sign} | ' if fmt.signed else ''}"
            f"{format(fields.exponent, f'0{fmt.exponent_bits}b')} | "
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
