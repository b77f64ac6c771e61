"""Floating-point formats from the bits up: FP32, FP16, BF16, FP8, FP6, FP4, E8M0, and any other.

A binary float stores a sign, an exponent and a mantissa (the fraction bits after an implicit
leading 1). `FloatFormat` derives everything else from a few choices that real formats make
differently: the widths, the exponent bias, whether there is a sign, a zero, infinities, and
where NaN lives. From those follow the largest finite value, the smallest normal and subnormal
values, machine epsilon.

`as_format` turns what a user may write for a format (`BF16`, `torch.bfloat16`, "bf16",
"bfloat16") into the `FloatFormat`; every public function that takes a format calls it first.
Rounding to a format builds on this module (`mpcourse.numbers.rounding`), and
`mpcourse.numbers.formats` hands on both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mpcourse.numbers.precision import dtype_name

__all__ = ["FloatFormat", "as_format", "ROUNDING_MODES", "OVERFLOW_MODES", "NAN_ENCODINGS",
           "FP32", "FP16", "BF16", "FP8_E4M3", "FP8_E5M2", "FP8_E4M3FNUZ", "FP8_E5M2FNUZ",
           "FP8_E8M0", "E8M0_TORCH_ROUNDS_UP", "FP6_E2M3", "FP6_E3M2", "FP4_E2M1", "TF32", "FORMATS",
           "ALL_FORMATS"]

#: How a value between two of a format's values is rounded (see `mpcourse.numbers.rounding`).
ROUNDING_MODES = ("nearest_even", "nearest_away", "toward_zero", "stochastic")
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
        if not isinstance(self.name, str):
            raise TypeError(f"a format's name must be a string, got {self.name!r}")
        for flag in ("has_inf", "signed", "has_zero"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{self.name}: {flag} must be True or False, got {getattr(self, flag)!r}")
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
# The MX block scale: a bare power of two, 2**-127 to 2**127, code 0xFF is NaN. Like torch's
# cast, it drops the sign, gives 2**-127 for zero, rounds ties up, and turns overflow and inf
# into NaN. It rounds to the power of two nearest in value everywhere, as ml_dtypes 0.7 does,
# which is what the format means. torch 2.13's cast differs on float32 subnormal inputs: it
# rounds every one above 2**-127 up to 2**-126, so on E8M0_TORCH_ROUNDS_UP, from 2**-127 to
# 1.5 * 2**-127 (both excluded), torch gives twice the nearest power of two.
FP8_E8M0 = FloatFormat("fp8_e8m0", 8, 0, has_inf=False, overflow="nan", signed=False,
                       has_zero=False, rounding="nearest_away", torch_dtype=torch.float8_e8m0fnu)
E8M0_TORCH_ROUNDS_UP = (2.0**-127, 1.5 * 2.0**-127)   # open interval, float32 subnormals
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


#: Each format by its own name ("bf16") and by its torch dtype's name ("bfloat16").
_BY_NAME = {fmt.name: fmt for fmt in ALL_FORMATS + (TF32,)}
_BY_DTYPE = {fmt.torch_dtype: fmt for fmt in ALL_FORMATS if fmt.torch_dtype is not None}


def as_format(fmt: FloatFormat | torch.dtype | str, argument: str = "fmt") -> FloatFormat:
    """`fmt` as a `FloatFormat`: one itself, a torch dtype (`torch.bfloat16` is BF16), or a name.

    A name is the course's (`"bf16"`, `"fp8_e4m3"`, `"tf32"`, any case) or any name torch gives a
    dtype (`"bfloat16"`, `"half"`, `"float8_e4m3fn"`), which means what that dtype means. Every
    public function that takes a format calls this first, so all of them take the same spellings
    and refuse the rest alike: TypeError for a value of another type, ValueError for a dtype or
    name that is no format here, with what is allowed. `argument` is the caller's parameter name.
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    if isinstance(fmt, str):
        key = fmt.strip().lower().removeprefix("torch.")
        if key in _BY_NAME:
            return _BY_NAME[key]
        dtype = getattr(torch, key, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{argument}={fmt!r} names no format; the formats are "
                             f"{', '.join(_BY_NAME)}, or a torch dtype's name such as 'bfloat16'")
        fmt = dtype
    if isinstance(fmt, torch.dtype):
        if fmt in _BY_DTYPE:
            return _BY_DTYPE[fmt]
        why = {torch.float64: " (formats are emulated inside float32, which cannot hold float64)",
               torch.float4_e2m1fn_x2: " (it packs two FP4 codes in a byte: use FP4_E2M1)"}.get(fmt, "")
        raise ValueError(f"{argument}={fmt} has no FloatFormat{why}; the dtypes with one are "
                         f"{', '.join(dtype_name(d) for d in _BY_DTYPE)}")
    raise TypeError(f"{argument} must be a FloatFormat (e.g. mpcourse.numbers.BF16), a torch dtype or a "
                    f"format name, got {fmt!r} of type {type(fmt).__name__}")
