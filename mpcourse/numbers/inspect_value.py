"""One value in one format, taken apart: its bits, its neighbours, the grid it sits on.

`mpcourse.numbers.formats` says what a format is and `round_to` stores a tensor in it; these tools
look at the result one number at a time, the way lesson 01 does. `bits` and `from_bits` go
between a value and its sign, exponent and mantissa fields; `neighbours` gives the
representable values on either side, `grid` every value of a range; `explain_value` puts it
all together for one number, with the rounding error it suffered.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from mpcourse.numbers.float_format import FloatFormat, as_format
from mpcourse.numbers.rounding import round_to

__all__ = ["Bits", "bits", "from_bits", "neighbours", "grid", "ValueExplanation", "explain_value"]


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


#: The most values `grid` lists: enough for any plot or table of a format's values.
MAX_GRID = 1 << 20


def bits(value: float, fmt: FloatFormat) -> Bits:
    """The sign, exponent and mantissa fields of `value` rounded to `fmt` (by fmt's own cast).

    `value` is first stored as float32, as it would be in a tensor. An unsigned format has
    sign 0. A NaN gets the format's one NaN code (IEEE formats: the quiet NaN).
    """
    fmt = as_format(fmt)
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
    fmt = as_format(fmt)
    fields = {"sign": sign, "exponent": exponent, "mantissa": mantissa}
    for name, field in fields.items():
        if isinstance(field, bool) or not isinstance(field, int):
            raise TypeError(f"from_bits: {name} must be an integer field, got {field!r}")
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
    fmt = as_format(fmt)
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


def _position(value: float, fmt: FloatFormat) -> int:
    """Where finite `value`, rounded to `fmt`, sits among fmt's values: its code, negative below zero."""
    field = bits(value, fmt)
    code = (field.exponent << fmt.mantissa_bits) + field.mantissa
    return -code if field.sign else code


def grid(fmt: FloatFormat, low: float, high: float) -> list[float]:
    """Every finite value of `fmt` in [low, high], in increasing order (at most `MAX_GRID` of them:
    a wider range, such as FP32's values in [0, 1], is refused before any is listed)."""
    fmt = as_format(fmt)
    if not low <= high:
        raise ValueError(f"grid needs low <= high, got low={low}, high={high}")
    lowest = -fmt.max if fmt.signed else (0.0 if fmt.has_zero else fmt.smallest_subnormal)
    count = _position(min(high, fmt.max), fmt) - _position(max(low, lowest), fmt) + 1
    if count > MAX_GRID:
        raise ValueError(f"{fmt.name} holds about {count:,} values in [{low}, {high}], more than grid lists "
                         f"({MAX_GRID:,}); narrow the range")
    value = _round_scalar(max(low, lowest), fmt)
    if value < low:
        value = _step(value, fmt, +1)
    values = []
    while value <= high and math.isfinite(value):
        values.append(value)
        value = _step(value, fmt, +1)
    return values


@dataclass(frozen=True)
class ValueExplanation:
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


def explain_value(value: float, fmt: FloatFormat) -> ValueExplanation:
    """Store `value` in `fmt` and describe the result: fields, exponent, neighbours, error.

    `value` is first stored as float32 (as in a tensor); the error is measured against `value`
    itself, so for FP32 it shows float32's own rounding.
    """
    fmt = as_format(fmt)
    value = float(value)
    below, above = neighbours(value, fmt)
    return ValueExplanation(value, fmt, _round_scalar(value, fmt), bits(value, fmt), below, above)


def _round_scalar(value: float, fmt: FloatFormat) -> float:
    return round_to(torch.tensor([float(value)], dtype=torch.float32), fmt).item()
