"""The fnuz FP8 formats, E8M0, FP6 and FP4, bit for bit against torch's casts and ml_dtypes."""
import math

import ml_dtypes
import numpy as np
import pytest
import torch

from mpcourse.numbers.formats import (E8M0_TORCH_ROUNDS_UP, FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3,
                                       FP8_E4M3FNUZ, FP8_E5M2FNUZ, FP8_E8M0, FloatFormat, round_to)
from mpcourse.numbers.inspect_value import bits, explain_value, from_bits, grid, neighbours

TORCH_FORMATS = (FP8_E4M3FNUZ, FP8_E5M2FNUZ, FP8_E8M0)
ML_DTYPE = {FP8_E4M3FNUZ: ml_dtypes.float8_e4m3fnuz, FP8_E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
            FP8_E8M0: ml_dtypes.float8_e8m0fnu, FP6_E2M3: ml_dtypes.float6_e2m3fn,
            FP6_E3M2: ml_dtypes.float6_e3m2fn, FP4_E2M1: ml_dtypes.float4_e2m1fn}
MX_ELEMENTS = (FP6_E2M3, FP6_E3M2, FP4_E2M1)
torch_formats = pytest.mark.parametrize("fmt", TORCH_FORMATS, ids=lambda f: f.name)
all_six = pytest.mark.parametrize("fmt", tuple(ML_DTYPE), ids=lambda f: f.name)


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor, x: torch.Tensor) -> None:
    """Bitwise equal, except that any NaN matches any NaN."""
    same = (got.view(torch.int32) == expected.view(torch.int32)) | (got.isnan() & expected.isnan())
    if not bool(same.all()):
        bad = (~same).nonzero().flatten()[:5]
        rows = [f"x={x[i].item()!r} (0x{x.view(torch.int32)[i].item() & 0xFFFFFFFF:08x}): "
                f"got {got[i].item()!r}, reference {expected[i].item()!r}" for i in bad]
        pytest.fail(f"{int((~same).sum())} mismatches, e.g.\n" + "\n".join(rows))


def torch_cast(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    return x.to(fmt.torch_dtype).float()


def ml_cast(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    return torch.from_numpy(x.numpy().astype(ML_DTYPE[fmt]).astype(np.float32))


def next_up(value: float) -> float:
    return torch.nextafter(f32([value]), f32([math.inf])).item()


def next_down(value: float) -> float:
    return torch.nextafter(f32([value]), f32([-math.inf])).item()


def boundary_values(fmt: FloatFormat) -> list[float]:
    """The format's edge cases from its own parameters, each with its float32 neighbours."""
    tiny, top = fmt.smallest_subnormal, fmt.max
    ulp_at_max = math.ldexp(1.0, fmt.max_exponent - fmt.mantissa_bits)
    centres = [0.0, tiny, tiny / 2, tiny / 4, 1.5 * tiny, 2.5 * tiny, fmt.smallest_normal,
               fmt.smallest_normal * 0.75, top, top + ulp_at_max / 2, top + ulp_at_max, 2 * top,
               1.0, 1 + fmt.eps / 2, 3.0, 2.0**-127, 2.0**-126, 0.75 * 2.0**-126, 1e-45]
    for exponent in range(fmt.min_exponent, fmt.max_exponent + 1):   # ties in every binade
        centres += [math.ldexp(1 + j * fmt.eps / 2, exponent) for j in (1, 2, 3)]
    values = []
    for value in centres:
        value = f32([value]).item()
        values += [value, next_up(value), next_down(value)]
    values += [3.4028234663852886e38, math.inf, math.nan]
    return values + [-v for v in values]


def random_patterns(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31, (n,), dtype=torch.int64,
                         generator=generator).to(torch.int32).view(torch.float32)


def patterns_near_range(fmt: FloatFormat, n: int, seed: int) -> torch.Tensor:
    """Random patterns with exponents in and just around the format's range, both signs."""
    generator = torch.Generator().manual_seed(seed)
    low = max(fmt.min_exponent - fmt.mantissa_bits - 3 + 127, 0)
    high = min(fmt.max_exponent + 2 + 127, 255)
    exponent = torch.randint(low, high + 1, (n,), generator=generator, dtype=torch.int32)
    mantissa = torch.randint(0, 1 << 23, (n,), generator=generator, dtype=torch.int32)
    sign = torch.randint(0, 2, (n,), generator=generator, dtype=torch.int32) << 31
    return (sign | (exponent << 23) | mantissa).view(torch.float32)


def one_million(fmt: FloatFormat, seed: int) -> torch.Tensor:
    """2**20 patterns over all exponents, 2**20 around the format's range, and the boundaries."""
    return torch.cat([random_patterns(1 << 20, seed), patterns_near_range(fmt, 1 << 20, seed + 1),
                      f32(boundary_values(fmt))])


# --- the constants against torch.finfo and ml_dtypes.finfo ---------------------------------------

@torch_formats
def test_constants_match_torch_finfo(fmt):
    info = torch.finfo(fmt.torch_dtype)
    assert (fmt.bits, fmt.max, fmt.smallest_normal) == (info.bits, info.max, info.smallest_normal)
    # eps is the gap above 1, read from torch's own codes (1.0 and the code after it).
    one = f32([1.0]).to(fmt.torch_dtype).view(torch.uint8)
    after_one = (one + 1).view(fmt.torch_dtype).float().item()
    assert fmt.eps == after_one - 1.0
    # torch 2.13's finfo says 0.125 for e5m2fnuz, which has 2 mantissa bits (ml_dtypes: 0.25).
    assert info.eps == (0.125 if fmt is FP8_E5M2FNUZ else fmt.eps)


@all_six
def test_constants_match_ml_dtypes_finfo(fmt):
    info = ml_dtypes.finfo(ML_DTYPE[fmt])
    assert fmt.bits == info.bits
    assert fmt.max == float(info.max)
    assert fmt.smallest_normal == float(info.smallest_normal)
    assert fmt.smallest_subnormal == float(info.smallest_subnormal)
    assert fmt.eps == float(info.eps)


def test_mx_spec_element_exponents():
    """emax_elem of the MX spec: 8 for E4M3, 15 for E5M2, 4 for E3M2, 2 for E2M3 and E2M1."""
    from mpcourse.numbers.formats import FP8_E5M2
    emax = {FP8_E4M3: 8, FP8_E5M2: 15, FP6_E3M2: 4, FP6_E2M3: 2, FP4_E2M1: 2}
    assert {fmt: fmt.max_exponent for fmt in emax} == emax


# --- torch's conventions, pinned for the installed version ---------------------------------------

def test_installed_torch_e8m0_conventions():
    """Sign dropped, no zero, ties up, inf and overflow to NaN; if torch changes, this says so."""
    x = f32([-2.5, 0.0, -0.0, 1e-40, 1.5, 3.0, 0.375, 2.9e38, math.inf, math.nan])
    expected = [2.0, 2.0**-127, 2.0**-127, 2.0**-127, 2.0, 4.0, 0.5]
    got = torch_cast(x, FP8_E8M0)
    assert got[:7].tolist() == expected and got[7:].isnan().all()
    assert round_to(x, FP8_E8M0)[:7].tolist() == expected and round_to(x, FP8_E8M0)[7:].isnan().all()


def test_installed_torch_fnuz_overflow_is_nan_and_has_no_negative_zero():
    for fmt in (FP8_E4M3FNUZ, FP8_E5M2FNUZ):
        x = f32([fmt.max * 1.2, -fmt.max * 1.2, math.inf, -0.0, -fmt.smallest_subnormal / 4])
        got, reference = round_to(x, fmt), torch_cast(x, fmt)
        assert got[:3].isnan().all() and reference[:3].isnan().all()
        assert got[3:].view(torch.int32).tolist() == [0, 0] == reference[3:].view(torch.int32).tolist()


# --- round_to bit for bit -------------------------------------------------------------------------

def in_e8m0_torch_range(x: torch.Tensor) -> torch.Tensor:
    low, high = E8M0_TORCH_ROUNDS_UP
    return (x.abs() > low) & (x.abs() < high)


@torch_formats
def test_matches_torch_bitwise_on_boundaries_and_two_million_patterns(fmt):
    """Everywhere but E8M0 from float32 subnormals in (2**-127, 1.5 * 2**-127): see the next test."""
    x = one_million(fmt, 20 + TORCH_FORMATS.index(fmt))
    if fmt is FP8_E8M0:
        x = x[~in_e8m0_torch_range(x)]
    assert_same_bits(round_to(x, fmt), torch_cast(x, fmt), x)


def test_e8m0_rounds_to_the_nearest_power_where_torch_rounds_subnormals_up():
    """Every float32 subnormal above 2**-127: torch 2.13 gives 2**-126 to all of them, ml_dtypes
    0.7 and FP8_E8M0 the nearest power of two, which is 2**-127 below 1.5 * 2**-127 (the tie goes
    up). If a release of either library changes this, the test says so."""
    patterns = torch.arange(0x00400001, 0x00800000, dtype=torch.int32)    # (2**-127, 2**-126)
    x = patterns.view(torch.float32)
    x = torch.cat([x, -x])                                                 # the sign is dropped
    nearest = torch.where(x.abs() < 1.5 * 2.0**-127, 2.0**-127, 2.0**-126)
    disputed = in_e8m0_torch_range(x)
    assert int(disputed.sum()) == 2 * (0x00600000 - 0x00400001)           # 4,194,302 values
    assert_same_bits(round_to(x, FP8_E8M0), nearest, x)
    positive = x > 0                                                       # ml_dtypes: NaN below 0
    assert_same_bits(ml_cast(x[positive], FP8_E8M0), nearest[positive], x[positive])
    assert torch_cast(x, FP8_E8M0).eq(2.0**-126).all()
    assert not torch_cast(x[disputed], FP8_E8M0).eq(nearest[disputed]).any()
    assert torch_cast(x[~disputed], FP8_E8M0).eq(nearest[~disputed]).all()


@all_six
def test_matches_ml_dtypes_bitwise(fmt):
    """ml_dtypes leaves negative, zero, infinite and NaN inputs of E8M0 as NaN (torch does not)."""
    x = one_million(fmt, 30 + tuple(ML_DTYPE).index(fmt))
    if fmt is FP8_E8M0:
        x = x[(x > 0) & x.isfinite()]
    else:
        x = x[~x.isnan()]   # FP6 and FP4 have no NaN: what a NaN becomes is the library's choice
    assert x.numel() > 1_000_000
    assert_same_bits(round_to(x, fmt), ml_cast(x, fmt), x)


@pytest.mark.parametrize("fmt", MX_ELEMENTS, ids=lambda f: f.name)
def test_mx_elements_saturate_and_keep_nan_as_nan(fmt):
    got = round_to(f32([1e6, -1e6, math.inf, -math.inf, math.nan]), fmt)
    assert got[:4].tolist() == [fmt.max, -fmt.max, fmt.max, -fmt.max] and got[4].isnan()


@pytest.mark.parametrize("fmt", (FP8_E4M3FNUZ, FP6_E2M3, FP4_E2M1), ids=lambda f: f.name)
def test_toward_zero_never_exceeds_x_and_nearest_away_differs_only_on_ties(fmt):
    values = grid(fmt, -fmt.max, fmt.max)
    midpoints = f32([(a + b) / 2 for a, b in zip(values, values[1:])])   # every tie
    x = torch.cat([patterns_near_range(fmt, 1 << 16, 40), midpoints])
    x = x[x.abs() <= fmt.max]
    toward, even, away = (round_to(x, fmt, mode) for mode in ("toward_zero", "nearest_even",
                                                                "nearest_away"))
    assert (toward.abs() <= x.abs()).all()
    differ = even != away
    halfway = (x - toward).abs() * 2 == (away - toward).abs()
    assert differ.any() and halfway[differ].all()


# --- reading codes: from_bits, bits, grid ---------------------------------------------------------

def every_code(fmt: FloatFormat) -> list[tuple[int, int, int]]:
    signs = (0, 1) if fmt.signed else (0,)
    return [(s, e, m) for s in signs for e in range(2**fmt.exponent_bits)
            for m in range(2**fmt.mantissa_bits)]


def reference_value(fmt: FloatFormat, sign: int, exponent: int, mantissa: int) -> float:
    code = (sign << (fmt.bits - 1)) | (exponent << fmt.mantissa_bits) | mantissa
    stored = torch.tensor([code], dtype=torch.uint8)
    if fmt.torch_dtype is not None:
        return stored.view(fmt.torch_dtype).float().item()
    return float(stored.numpy().view(ML_DTYPE[fmt]).astype(np.float32)[0])


@all_six
def test_from_bits_reads_every_code_like_the_reference_and_bits_reads_it_back(fmt):
    for sign, exponent, mantissa in every_code(fmt):
        want = reference_value(fmt, sign, exponent, mantissa)
        got = from_bits(sign, exponent, mantissa, fmt)
        assert got == want or (math.isnan(got) and math.isnan(want)), (fmt.name, sign, exponent, mantissa)
        if math.isnan(want):
            assert bits(got, fmt)[:3] == (sign, exponent, mantissa) or fmt.nan == "ieee"
        elif not (want == 0 and sign == 1 and fmt.nan == "negative_zero"):
            assert bits(got, fmt)[:3] == (sign, exponent, mantissa), (fmt.name, got)


@all_six
def test_grid_lists_every_finite_value_of_the_reference(fmt):
    values = {reference_value(fmt, *code) for code in every_code(fmt)}
    finite = sorted(v for v in values if math.isfinite(v))
    assert grid(fmt, -math.inf, math.inf) == sorted(set(finite))
    assert grid(fmt, 0.9, 2.1) == [v for v in finite if 0.9 <= v <= 2.1]


def test_neighbours_and_explain_value_at_the_edges_of_the_new_formats():
    assert neighbours(FP8_E8M0.smallest_subnormal, FP8_E8M0)[1] == 2.0**-126
    assert math.isnan(neighbours(FP8_E8M0.smallest_subnormal, FP8_E8M0)[0])
    assert math.isnan(neighbours(FP8_E8M0.max, FP8_E8M0)[1])
    assert neighbours(FP4_E2M1.max, FP4_E2M1)[0] == 4.0
    assert neighbours(0.0, FP8_E4M3FNUZ) == (-FP8_E4M3FNUZ.smallest_subnormal,
                                             FP8_E4M3FNUZ.smallest_subnormal)
    e = explain_value(3.0, FP8_E8M0)
    assert e.stored == 4.0 and e.kind == "normal" and e.exponent == 2 and "no sign" in str(e)
    assert explain_value(2.0**-127, FP8_E8M0).kind == "normal"
    assert "code of -0" in str(explain_value(math.nan, FP8_E4M3FNUZ))
    with pytest.raises(ValueError, match="fp4_e2m1 has no NaN"):
        bits(math.nan, FP4_E2M1)
    with pytest.raises(ValueError, match="sign 0, exponent"):
        from_bits(1, 127, 0, FP8_E8M0)
