"""mpcourse.numbers.inspect_value: one value's bits, neighbours and grid, against torch's own dtypes."""
import math

import pytest
import torch

from mpcourse.numbers.formats import BF16, FORMATS, FP8_E4M3, FP8_E5M2, FP16, FP32, FloatFormat
from mpcourse.numbers.inspect_value import Bits, bits, explain_value, from_bits, grid, neighbours

# Signed integer views with the width of each torch dtype, to read its bit patterns.
CODE_DTYPE = {torch.float32: torch.int32, torch.float16: torch.int16,
              torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8,
              torch.float8_e5m2: torch.uint8}


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def torch_cast(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    return x.to(fmt.torch_dtype).float()


def pack(fields: Bits, fmt: FloatFormat) -> int:
    return (fields.sign << (fmt.bits - 1)) | (fields.exponent << fmt.mantissa_bits) | fields.mantissa


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_bits_are_torchs_bit_patterns(fmt):
    generator = torch.Generator().manual_seed(9)
    values = (torch.randn(300, generator=generator) * 10.0 ** torch.randint(
        -12, 8, (300,), generator=generator)).tolist()
    values += [0.0, -0.0, 1.0, -2.5, 1e-8, 70000.0, 500.0, 1e-45, math.inf, -math.inf]
    width = CODE_DTYPE[fmt.torch_dtype]
    for value in values:
        fields = bits(value, fmt)
        code = f32([value]).to(fmt.torch_dtype).view(width).to(torch.int64).item() % 2**fmt.bits
        assert pack(fields, fmt) == code, (fmt.name, value, fields)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_bits_of_nan(fmt):
    fields = bits(math.nan, fmt)
    assert fields.exponent == 2**fmt.exponent_bits - 1 and fields.mantissa != 0
    assert math.isnan(from_bits(fields.sign, fields.exponent, fields.mantissa, fmt))


@pytest.mark.parametrize("fmt", (FP16, BF16, FP8_E4M3, FP8_E5M2), ids=lambda f: f.name)
def test_from_bits_reads_every_code_like_torch(fmt):
    width = CODE_DTYPE[fmt.torch_dtype]
    codes = torch.arange(2**fmt.bits, dtype=torch.int64)
    signed = codes - 2**fmt.bits * (codes >= 2 ** (fmt.bits - 1)) if width != torch.uint8 else codes
    expected = signed.to(width).view(fmt.torch_dtype).float().tolist()
    for code, want in zip(codes.tolist(), expected):
        sign, exponent, mantissa = (code >> (fmt.bits - 1), (code >> fmt.mantissa_bits)
                                    % 2**fmt.exponent_bits, code % 2**fmt.mantissa_bits)
        got = from_bits(sign, exponent, mantissa, fmt)
        assert got == want or (math.isnan(got) and math.isnan(want)), (fmt.name, hex(code))
        if not math.isnan(want) and code % 97 == 0:   # a sample: bits() is the slower way back
            assert bits(got, fmt)[:3] == (sign, exponent, mantissa)


@pytest.mark.parametrize("fmt", (FP16, BF16), ids=lambda f: f.name)
def test_neighbours_match_torch_nextafter(fmt):
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(200, generator=generator) * 10.0 ** torch.randint(-9, 6, (200,), generator=generator)
    stored = x.to(fmt.torch_dtype)
    up = torch.nextafter(stored, torch.full_like(stored, math.inf)).float().tolist()
    down = torch.nextafter(stored, torch.full_like(stored, -math.inf)).float().tolist()
    for value, below, above in zip(x.tolist(), down, up):
        assert neighbours(value, fmt) == (below, above), (fmt.name, value)


def test_neighbours_at_the_edges():
    assert neighbours(0.0, FP16) == (-FP16.smallest_subnormal, FP16.smallest_subnormal)
    assert neighbours(FP16.max, FP16) == (65472.0, math.inf)
    assert neighbours(math.inf, FP16) == (FP16.max, math.inf)
    below, above = neighbours(FP8_E4M3.max, FP8_E4M3)
    assert below == 416.0 and math.isnan(above)   # past 448 there is only NaN in E4M3


@pytest.mark.parametrize("fmt", (FP8_E4M3, FP8_E5M2), ids=lambda f: f.name)
def test_grid_lists_every_finite_value_torch_has(fmt):
    every = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(fmt.torch_dtype).float()
    finite = sorted(set(every[every.isfinite()].tolist()))
    assert grid(fmt, -fmt.max, fmt.max) == finite
    assert grid(fmt, 0.9, 2.1) == [v for v in finite if 0.9 <= v <= 2.1]


def test_grid_around_one_in_fp16_has_the_expected_spacing():
    values = grid(FP16, 1.0, 2.0)
    assert len(values) == 2**10 + 1
    assert all(b - a == FP16.eps for a, b in zip(values, values[1:]))
    with pytest.raises(ValueError, match="low <= high"):
        grid(FP16, 2.0, 1.0)


def test_explain_value_describes_the_stored_value():
    e = explain_value(0.1, FP16)
    assert e.stored == torch_cast(f32([0.1]), FP16).item()
    assert e.kind == "normal" and e.exponent == -4
    assert e.bits == bits(0.1, FP16)
    assert e.below < e.stored < e.above
    assert e.relative_error == abs(e.stored - 0.1) / 0.1
    text = str(e)
    assert f"{e.bits.sign} | {e.bits.exponent:05b} | {e.bits.mantissa:010b}" in text
    assert f"field {e.bits.exponent} - bias 15 = -4" in text and repr(e.stored) in text
    assert e.formula == f"(1 + {e.bits.mantissa}/1024) x 2**-4"
    assert (1 + e.bits.mantissa / 1024) * 2**-4 == e.stored
    negative_tiny = explain_value(-1e-7, FP16)
    assert negative_tiny.formula == f"-({negative_tiny.bits.mantissa}/1024) x 2**-14"
    assert -(negative_tiny.bits.mantissa / 1024) * 2**-14 == negative_tiny.stored

    subnormal, zero, inf = (explain_value(v, FP16) for v in (1e-7, 1e-9, 70000))
    assert subnormal.kind == "subnormal" and subnormal.exponent == -14
    assert zero.kind == "zero" and zero.relative_error == 1.0
    assert inf.kind == "inf" and inf.relative_error == math.inf
    assert explain_value(70000, BF16).stored == torch_cast(f32([70000]), BF16).item()
    assert explain_value(500, FP8_E4M3).stored == 448.0
    assert explain_value(math.nan, FP8_E5M2).kind == "nan"
    assert math.isnan(explain_value(math.nan, FP8_E5M2).relative_error)
    assert explain_value(0.1, FP32).relative_error == abs(f32([0.1]).item() - 0.1) / 0.1 > 0


def test_from_bits_rejects_fields_that_do_not_fit():
    with pytest.raises(ValueError, match="don't fit fp8_e4m3"):
        from_bits(0, 16, 0, FP8_E4M3)


def test_the_inspection_tools_live_only_in_inspect_value():
    import mpcourse.numbers.formats as formats
    for moved in ("neighbours", "grid", "explain", "bits", "Explanation"):
        with pytest.raises(AttributeError, match=f"no attribute '{moved}'"):
            getattr(formats, moved)
