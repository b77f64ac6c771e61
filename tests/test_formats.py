"""mpcourse.numbers.formats against torch's own casts, bit for bit."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpcourse.numbers.formats import (ALL_FORMATS, BF16, FORMATS, FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3,
                                       FP8_E4M3FNUZ, FP8_E5M2, FP8_E5M2FNUZ, FP16, FP32, TF32, FloatFormat,
                                       round_to)
from mpcourse.numbers.inspect_value import explain_value, neighbours

LOW_PRECISION = (FP16, BF16, FP8_E4M3, FP8_E5M2)
# Signed integer views with the width of each torch dtype, to read its bit patterns.
CODE_DTYPE = {torch.float32: torch.int32, torch.float16: torch.int16,
              torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8,
              torch.float8_e5m2: torch.uint8}
ids = pytest.mark.parametrize("fmt", LOW_PRECISION, ids=lambda f: f.name)


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def from_patterns(patterns) -> torch.Tensor:
    """Float32 values with the given bit patterns (Python ints, unsigned or signed)."""
    signed = [p - 2**32 if p >= 2**31 else p for p in patterns]
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


def torch_cast(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    return x.to(fmt.torch_dtype).float()


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor, x: torch.Tensor) -> None:
    """Bitwise equal, except that any NaN matches any NaN (payloads are not compared)."""
    assert got.dtype == torch.float32 and got.shape == expected.shape
    both_nan = got.isnan() & expected.isnan()
    same = (got.view(torch.int32) == expected.view(torch.int32)) | both_nan
    if not bool(same.all()):
        bad = (~same).nonzero().flatten()[:5]
        rows = [f"x={x[i].item()!r} (0x{x.view(torch.int32)[i].item() & 0xFFFFFFFF:08x}): "
                f"got {got[i].item()!r}, torch {expected[i].item()!r}" for i in bad]
        pytest.fail(f"{int((~same).sum())} mismatches, e.g.\n" + "\n".join(rows))


def next_up(value: float) -> float:
    """The next float32 above `value`."""
    return torch.nextafter(f32(value), f32(math.inf)).item()


def next_down(value: float) -> float:
    return torch.nextafter(f32(value), f32(-math.inf)).item()


def boundary_values(fmt: FloatFormat) -> list[float]:
    """The edge cases of `fmt`, derived from its own parameters, with float32 neighbours."""
    tiny, eps, top = fmt.smallest_subnormal, fmt.eps, fmt.max
    ulp_at_max = math.ldexp(1.0, fmt.max_exponent - fmt.mantissa_bits)
    centres = [
        0.0, tiny, tiny / 2, tiny / 4, 1.5 * tiny, 2.5 * tiny, 3.5 * tiny,
        fmt.smallest_normal, fmt.smallest_normal - tiny / 2, fmt.smallest_normal - tiny,
        1.0, 1 + eps / 2, 1 + 3 * eps / 2, 1 + eps, 2 - eps / 2, 2.0, 3.0 + eps,
        top, top + ulp_at_max / 2, top + ulp_at_max, 2 * top,
    ] + [(k + 0.5) * tiny for k in range(8)]
    # Ties in every binade of the format, from the smallest normal to the largest.
    for exponent in range(fmt.min_exponent, fmt.max_exponent + 1):
        centres += [math.ldexp(1 + j * eps / 2, exponent) for j in (1, 2, 3)]
    values = []
    for value in centres:
        value = f32(value).item()   # each centre as float32; some are huge, and become inf
        values += [value, next_up(value), next_down(value)]
    values += [3.4028234663852886e38, math.inf, math.nan]
    return values + [-v for v in values]


# --- torch's behaviour that the formats copy, pinned for the installed version ---------------

def test_installed_torch_saturates_e4m3_and_overflows_e5m2_to_inf():
    """If a torch release changes its FP8 overflow rule, this test says so first."""
    x = f32([464.0, 500.0, 1e6, math.inf, -1e6, -math.inf])
    assert torch_cast(x, FP8_E4M3).tolist() == [448.0, 448.0, 448.0, 448.0, -448.0, -448.0]
    assert FP8_E4M3.overflow == "saturate" and not FP8_E4M3.has_inf
    assert torch_cast(f32([61440.0, 1e6]), FP8_E5M2).tolist() == [math.inf, math.inf]
    assert FP8_E5M2.overflow == "inf"


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_format_constants_match_torch_finfo(fmt):
    info = torch.finfo(fmt.torch_dtype)
    assert fmt.bits == info.bits
    assert fmt.max == info.max
    assert fmt.smallest_normal == info.smallest_normal
    assert fmt.eps == info.eps
    assert 10 ** -fmt.decimal_digits == pytest.approx(info.eps / 2)   # digits = -log10(unit roundoff)
    # The smallest subnormal is the bit pattern 1, read in the format.
    one = torch.tensor([1], dtype=CODE_DTYPE[fmt.torch_dtype]).view(fmt.torch_dtype)
    assert fmt.smallest_subnormal == one.float().item()
    assert fmt.bias == 2 ** (fmt.exponent_bits - 1) - 1


def test_has_inf_matches_torch():
    for fmt in FORMATS:
        assert fmt.has_inf == math.isinf(torch_cast(f32([math.inf]), fmt).item()), fmt.name


# --- round_to, nearest even, bit for bit against torch -----------------------------------------

@ids
def test_boundary_cases_match_torch_bitwise(fmt):
    x = f32(boundary_values(fmt))
    assert_same_bits(round_to(x, fmt), torch_cast(x, fmt), x)


@ids
def test_zeros_keep_their_sign(fmt):
    x = f32([0.0, -0.0, fmt.smallest_subnormal / 4, -fmt.smallest_subnormal / 4])
    got = round_to(x, fmt)
    assert got.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert torch.signbit(got).tolist() == [False, True, False, True]


def test_all_sign_exponent_and_signaling_nan_patterns_stay_nan():
    patterns = [0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFFFFFFF, 0x7F80FFFF]
    x = from_patterns(patterns)
    for fmt in FORMATS:
        assert round_to(x, fmt).isnan().all(), fmt.name


@ids
def test_random_bit_patterns_over_all_exponents_match_torch(fmt):
    """2**24 uniformly random float32 patterns: every exponent field gets ~65,000 of them."""
    generator = torch.Generator().manual_seed(1 + LOW_PRECISION.index(fmt))
    x = torch.randint(-2**31, 2**31, (1 << 24,), dtype=torch.int64,
                      generator=generator).to(torch.int32).view(torch.float32)
    assert_same_bits(round_to(x, fmt), torch_cast(x, fmt), x)


@ids
def test_random_patterns_near_the_format_range_match_torch(fmt):
    """Patterns whose exponent lies in or just around the format's range (subnormals included)."""
    generator = torch.Generator().manual_seed(11)
    low = max(fmt.min_exponent - fmt.mantissa_bits - 3 + 127, 0)
    high = min(fmt.max_exponent + 2 + 127, 255)
    n = 1 << 21
    exponent = torch.randint(low, high + 1, (n,), generator=generator, dtype=torch.int32)
    mantissa = torch.randint(0, 1 << 23, (n,), generator=generator, dtype=torch.int32)
    sign = torch.randint(0, 2, (n,), generator=generator, dtype=torch.int32) << 31
    x = (sign | (exponent << 23) | mantissa).view(torch.float32)
    assert_same_bits(round_to(x, fmt), torch_cast(x, fmt), x)


def test_fp32_round_to_is_the_identity():
    generator = torch.Generator().manual_seed(2)
    x = torch.randint(-2**31, 2**31, (1 << 16,), dtype=torch.int64,
                      generator=generator).to(torch.int32).view(torch.float32)
    assert_same_bits(round_to(x, FP32), x, x)


def tf32_by_hand(x: torch.Tensor) -> torch.Tensor:
    """Round float32 `x` to TF32 on its bit patterns: keep the top 10 of the 23 mantissa bits,
    rounding the 13 dropped bits to nearest, ties to an even kept mantissa. A carry out of the
    mantissa steps the exponent (up to inf), as the integer addition does by itself."""
    pattern = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    dropped, kept = pattern & 0x1FFF, pattern & ~0x1FFF
    odd = (kept >> 13) & 1
    round_up = (dropped > 0x1000) | ((dropped == 0x1000) & (odd == 1))
    rounded = kept + round_up.to(torch.int64) * 0x2000
    return (rounded - 2**32 * (rounded >= 2**31)).to(torch.int32).view(torch.float32)


def test_tf32_is_fp32_with_the_low_13_mantissa_bits_rounded_to_nearest_even():
    assert (TF32.exponent_bits, TF32.mantissa_bits, TF32.bits) == (8, 10, 19)
    assert TF32.torch_dtype is None and TF32 not in ALL_FORMATS
    assert (TF32.max, TF32.smallest_normal) == (2**127 * (2 - 2**-10), FP32.smallest_normal)
    generator = torch.Generator().manual_seed(19)
    x = torch.randint(-2**31, 2**31, (1 << 16,), dtype=torch.int64,
                      generator=generator).to(torch.int32).view(torch.float32)
    ties = f32([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 2**127 * (2 - 2**-11),
                2**-137, 3 * 2**-137])   # the last two: halfway between TF32 subnormals
    x = torch.cat([x[~x.isnan()], ties, f32([0.0, -0.0, math.inf, -math.inf])])
    assert_same_bits(round_to(x, TF32), tf32_by_hand(x), x)
    assert round_to(ties, TF32).tolist() == [1.0, 1 + 2**-9, -1.0, math.inf, 0.0, 2**-135]
    assert round_to(f32([math.nan]), TF32).isnan().all()


def test_hand_built_e8m7_behaves_exactly_like_bf16():
    e8m7 = FloatFormat("e8m7", 8, 7)
    for name in ("bias", "max", "smallest_normal", "smallest_subnormal", "eps", "has_inf",
                 "overflow", "bits", "decimal_digits"):
        assert getattr(e8m7, name) == getattr(BF16, name), name
    generator = torch.Generator().manual_seed(3)
    random = torch.randint(-2**31, 2**31, (1 << 20,), dtype=torch.int64,
                           generator=generator).to(torch.int32).view(torch.float32)
    x = torch.cat([random, f32(boundary_values(BF16))])
    for rounding in ("nearest_even", "toward_zero"):
        assert_same_bits(round_to(x, e8m7, rounding), round_to(x, BF16, rounding), x)
    assert_same_bits(round_to(x, e8m7), torch_cast(x, BF16), x)
    for value in (0.1, 1e-40, 3e38, -7.0):
        described = str(explain_value(value, e8m7))
        assert described.replace("e8m7", "bf16") == str(explain_value(value, BF16))


def test_shapes_dtypes_and_input_untouched():
    x = torch.randn(3, 4, 5)[:, ::2]           # a non-contiguous view
    before = x.clone()
    got = round_to(x, FP16)
    assert got.shape == x.shape and got.dtype == torch.float32
    assert torch.equal(x, before)
    assert_same_bits(got.reshape(-1), torch_cast(x, FP16).reshape(-1), x.reshape(-1))
    assert round_to(torch.tensor(1 + 2**-11), FP16).item() == 1.0   # 0-dim
    assert round_to(torch.empty(0), FP16).shape == (0,)
    half = torch.randn(100).half()
    assert_same_bits(round_to(half, BF16), torch_cast(half.float(), BF16), half.float())


# --- other rounding modes -----------------------------------------------------------------------

def toward_zero_oracle(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Torch's nearest cast, stepped one code toward zero wherever it went past x."""
    codes = x.to(fmt.torch_dtype).view(CODE_DTYPE[fmt.torch_dtype]).to(torch.int32)
    sign_bit = 1 << (fmt.bits - 1)
    magnitude, sign = codes & (sign_bit - 1), codes & sign_bit
    nearest = torch_cast(x, fmt)
    went_past = (nearest.abs() > x.abs()) & ~x.isinf()
    stepped = (magnitude - went_past.int()) | sign
    dtype = CODE_DTYPE[fmt.torch_dtype]
    return stepped.to(torch.uint8 if dtype == torch.uint8 else dtype).view(fmt.torch_dtype).float()


@ids
def test_toward_zero_matches_stepped_torch_cast(fmt):
    generator = torch.Generator().manual_seed(4)
    random = torch.randint(-2**31, 2**31, (1 << 20,), dtype=torch.int64,
                           generator=generator).to(torch.int32).view(torch.float32)
    x = torch.cat([random, f32(boundary_values(fmt))])
    got = round_to(x, fmt, "toward_zero")
    assert_same_bits(got, toward_zero_oracle(x, fmt), x)
    finite = x.isfinite()
    assert (got[finite].abs() <= x[finite].abs()).all()
    assert got[finite].isfinite().all(), "truncating a finite value never overflows"


def test_toward_zero_of_bf16_is_clearing_the_low_16_bits():
    generator = torch.Generator().manual_seed(5)
    patterns = torch.randint(-2**31, 2**31, (1 << 18,), dtype=torch.int64,
                             generator=generator).to(torch.int32)
    x = patterns.view(torch.float32)
    truncated = torch.where(x.isnan(), x, (patterns & -(1 << 16)).view(torch.float32))
    assert_same_bits(round_to(x, BF16, "toward_zero"), truncated, x)


@pytest.mark.parametrize("fmt", (FP16, BF16, FP8_E4M3), ids=lambda f: f.name)
def test_stochastic_rounding_is_unbiased(fmt):
    """The mean of many stochastic roundings converges to x; nearest rounding does not."""
    generator = torch.Generator().manual_seed(6)
    n = 200_000
    cases = [1 + 0.1 * fmt.eps, 1 + 0.5 * fmt.eps, -(3 + 0.75 * 2 * fmt.eps),
             (5 + 1 / 3) * fmt.smallest_subnormal]   # the last one in the subnormal range
    for value in cases:
        x = f32([value] * n)
        value = x[0].item()
        low, high = sorted((round_to(x[:1], fmt, "toward_zero").item(), _away_from_zero(value, fmt)))
        got = round_to(x, fmt, "stochastic", generator=generator)
        assert set(got.unique().tolist()) <= {low, high}, (fmt.name, value)
        p = (value - low) / (high - low)
        sigma = (high - low) * math.sqrt(p * (1 - p) / n)
        mean = got.double().mean().item()
        assert abs(mean - value) < 5 * sigma, (fmt.name, value, mean, sigma)
        assert abs(round_to(x[:1], fmt).item() - value) > 20 * sigma   # nearest is biased here


# --- stochastic rounding with supplied random bits ----------------------------------------------

def random_patterns(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31, (n,), dtype=torch.int64,
                         generator=generator).to(torch.int32).view(torch.float32)


def one_code_away_from_zero(stored: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """The value of `fmt` one code further from zero than each `stored` (exact in fmt), by torch."""
    dtype = CODE_DTYPE[fmt.torch_dtype]
    codes = stored.to(fmt.torch_dtype).view(dtype).to(torch.int32)
    sign_bit = 1 << (fmt.bits - 1)
    stepped = ((codes & (sign_bit - 1)) + 1) | (codes & sign_bit)
    if dtype != torch.uint8:   # back to the signed range of the view's integer type
        stepped = stepped - (1 << fmt.bits) * (stepped >= sign_bit)
    return stepped.to(dtype).view(fmt.torch_dtype).float()


def in_range_values(fmt: FloatFormat, n: int, seed: int) -> torch.Tensor:
    """Random patterns and the format's boundary cases, finite and no larger than fmt.max."""
    x = torch.cat([random_patterns(n, seed), f32(boundary_values(fmt))])
    return x[x.isfinite() & (x.abs() <= fmt.max)]


@ids
def test_random_bits_of_zero_round_toward_zero(fmt):
    """Within the format's range (beyond it, stochastic rounding overflows like fmt.overflow)."""
    x = in_range_values(fmt, 1 << 18, 12)
    zeros = torch.zeros(x.shape, dtype=torch.int32)
    assert_same_bits(round_to(x, fmt, "stochastic", random_bits=zeros),
                     round_to(x, fmt, "toward_zero"), x)


@ids
def test_random_bits_of_all_ones_round_every_inexact_value_away_from_zero(fmt):
    x = in_range_values(fmt, 1 << 18, 13)
    ones = torch.full(x.shape, -1, dtype=torch.int32)
    toward = round_to(x, fmt, "toward_zero")
    expected = torch.where(toward == x, toward, one_code_away_from_zero(toward, fmt))
    assert_same_bits(round_to(x, fmt, "stochastic", random_bits=ones), expected, x)
    tiny = f32([2**-149, -2**-149, 2**-140])   # float32's smallest: far below half of fmt's
    got = round_to(tiny, fmt, "stochastic", random_bits=torch.full((3,), -1, dtype=torch.int32))
    assert got.tolist() == [fmt.smallest_subnormal, -fmt.smallest_subnormal, fmt.smallest_subnormal]


def test_random_bits_for_bf16_are_torchaos_add_and_clear():
    """On finite values not near overflow: (bits + (r & 0xFFFF)) & ~0xFFFF, bit for bit."""
    x = random_patterns(1 << 18, 14)
    x = x[x.isfinite() & (x.abs() < 1e38)]
    r = torch.randint(-2**31, 2**31, x.shape, dtype=torch.int64,
                      generator=torch.Generator().manual_seed(15)).to(torch.int32)
    patterns = x.view(torch.int32)
    expected = ((patterns + (r & 0xFFFF)) & ~0xFFFF).view(torch.float32)
    assert_same_bits(round_to(x, BF16, "stochastic", random_bits=r), expected, x)


@pytest.mark.parametrize("fmt", (BF16, FP16, FP8_E4M3), ids=lambda f: f.name)
def test_random_bits_replay_the_generator_when_the_same_bits_are_drawn(fmt):
    """Above the smallest normal the generator path draws 25 bits per element, once."""
    x = in_range_values(fmt, 100_000, 16)
    x = x[x.abs() >= fmt.smallest_normal]
    same_draw = torch.randint(0, 1 << 25, x.shape, generator=torch.Generator().manual_seed(17),
                              dtype=torch.int32)
    assert_same_bits(round_to(x, fmt, "stochastic", random_bits=same_draw),
                     round_to(x, fmt, "stochastic", generator=torch.Generator().manual_seed(17)), x)


@pytest.mark.parametrize("fmt", [FP16, FP8_E4M3], ids=lambda f: f.name)
def test_random_bits_below_half_the_smallest_subnormal_round_up_in_proportion(fmt):
    """Value v = f * smallest subnormal rounds up exactly for r & (2**25 - 1) >= 2**25 - ceil(f * 2**25)."""
    fraction = 0.3
    value = f32([fraction * fmt.smallest_subnormal]).item()
    top_bits = math.ceil(value / fmt.smallest_subnormal * 2**25)
    r = torch.arange(2**25 - top_bits - 2, 2**25 - top_bits + 2, dtype=torch.int32)
    x = f32([value] * r.numel())
    got = round_to(x, fmt, "stochastic", random_bits=r | (7 << 25))   # only the low 25 bits count
    assert got.tolist() == [0.0, 0.0, fmt.smallest_subnormal, fmt.smallest_subnormal]


@pytest.mark.parametrize("kwargs, message", [
    (dict(rounding="nearest_even", random_bits=torch.zeros(3, dtype=torch.int32)),
     "only used by rounding='stochastic', got 'nearest_even'"),
    (dict(random_bits=torch.zeros(3, dtype=torch.int32), generator=torch.Generator()),
     "either random_bits or generator"),
    (dict(random_bits=torch.zeros(3, dtype=torch.int64)), "int32 tensor, got torch.int64"),
    (dict(random_bits=[0, 0, 0]), "int32 tensor, got list"),
    (dict(random_bits=torch.zeros(4, dtype=torch.int32)), r"x's shape \(3,\).*got \(4,\)"),
])
def test_random_bits_rejects_what_does_not_fit(kwargs, message):
    kwargs = {"rounding": "stochastic", **kwargs}
    with pytest.raises(ValueError, match=message):
        round_to(torch.ones(3), BF16, **kwargs)


def _away_from_zero(value: float, fmt: FloatFormat) -> float:
    toward = round_to(f32([value]), fmt, "toward_zero").item()
    below, above = neighbours(toward, fmt)
    return above if value > 0 else below


def test_stochastic_rounding_is_reproducible_with_a_seeded_generator():
    x = torch.rand(10_000)
    first = round_to(x, BF16, "stochastic", generator=torch.Generator().manual_seed(7))
    again = round_to(x, BF16, "stochastic", generator=torch.Generator().manual_seed(7))
    other = round_to(x, BF16, "stochastic", generator=torch.Generator().manual_seed(8))
    assert torch.equal(first, again) and not torch.equal(first, other)
    exact = round_to(x, BF16)
    assert torch.equal(round_to(exact, BF16, "stochastic"), exact)   # representable: never moves


# --- properties (hypothesis) --------------------------------------------------------------------

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
formats = st.sampled_from(LOW_PRECISION + (FloatFormat("e3m4", 3, 4), FloatFormat("e6m9", 6, 9),
                                           FloatFormat("e2m1", 2, 1, has_inf=False),
                                           FP8_E4M3FNUZ, FP8_E5M2FNUZ, FP6_E2M3, FP6_E3M2, FP4_E2M1,
                                           FloatFormat("e5m3_bias20", 5, 3, has_inf=False, bias=20,
                                                       nan="negative_zero", overflow="nan")))
modes = st.sampled_from(("nearest_even", "toward_zero"))


def ulp(value: float, fmt: FloatFormat) -> float:
    """The spacing of fmt's grid at |value| (within the finite range)."""
    exponent = max(math.frexp(abs(value))[1] - 1, fmt.min_exponent) if value else fmt.min_exponent
    return math.ldexp(1.0, exponent - fmt.mantissa_bits)


@settings(max_examples=150, deadline=None)
@given(formats, modes, st.lists(finite32, min_size=2, max_size=64))
def test_rounding_is_monotonic(fmt, rounding, values):
    x = f32(sorted(values))
    got = round_to(x, fmt, rounding)
    ordered = ~got.isnan()   # NaN is unordered: formats that overflow to NaN give it past their max
    assert (got[ordered][1:] >= got[ordered][:-1]).all()
    assert (x[~ordered].abs() > fmt.max).all(), "NaN only for values beyond the format's range"


@settings(max_examples=150, deadline=None)
@given(formats, st.sampled_from(("nearest_even", "toward_zero", "stochastic")),
       st.lists(finite32, min_size=1, max_size=64))
def test_rounding_is_idempotent(fmt, rounding, values):
    once = round_to(f32(values), fmt)
    twice = round_to(once, fmt, rounding, generator=torch.Generator().manual_seed(0))
    assert_same_bits(twice, once, f32(values))


@settings(max_examples=300, deadline=None)
@given(formats, st.lists(finite32, min_size=1, max_size=64))
def test_nearest_error_is_at_most_half_an_ulp(fmt, values):
    in_range = [v for v in values if abs(v) <= fmt.max]
    got = round_to(f32(in_range), fmt).tolist()
    for value, rounded in zip(in_range, got):
        assert abs(rounded - value) <= ulp(value, fmt) / 2, (fmt, value, rounded)


@settings(max_examples=150, deadline=None)
@given(formats, st.lists(finite32, min_size=1, max_size=64), st.integers(0, 2**32 - 1))
def test_directed_and_stochastic_errors_are_below_one_ulp(fmt, values, seed):
    in_range = f32([v for v in values if abs(v) <= fmt.max])
    for rounding in ("toward_zero", "stochastic"):
        got = round_to(in_range, fmt, rounding, torch.Generator().manual_seed(seed)).tolist()
        for value, rounded in zip(in_range.tolist(), got):
            assert abs(rounded - value) < ulp(value, fmt), (fmt, rounding, value, rounded)


@settings(max_examples=100, deadline=None)
@given(formats, finite32)
def test_nearest_picks_the_closer_neighbour(fmt, value):
    if abs(value) > fmt.max:
        return
    stored = round_to(f32([value]), fmt).item()
    below, above = neighbours(value, fmt)
    for other in (below, above):
        if math.isfinite(other):
            assert abs(stored - value) <= abs(other - value)


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, message", [
    (torch.arange(4), "floating-point tensor, got torch.int64"),
    (torch.tensor([True]), "floating-point tensor, got torch.bool"),
    ([1.0, 2.0], "floating-point tensor, got list"),
    (torch.ones(2, dtype=torch.float64), "float64"),
])
def test_round_to_rejects_non_float32_compatible_input(bad, message):
    with pytest.raises(ValueError, match=message):
        round_to(bad, FP16)


def test_round_to_rejects_unknown_rounding_mode():
    with pytest.raises(ValueError, match="unknown rounding 'nearest'.*nearest_even"):
        round_to(torch.ones(2), FP16, rounding="nearest")


@pytest.mark.parametrize("kwargs, message", [
    (dict(exponent_bits=1, mantissa_bits=3), "at least 2 exponent bits.*got 1"),
    (dict(exponent_bits=0, mantissa_bits=3), "at least 2 exponent bits.*got 0"),
    (dict(exponent_bits=9, mantissa_bits=3), "exponent_bits must be.*got 9"),
    (dict(exponent_bits=5, mantissa_bits=24), "mantissa_bits must be.*got 24"),
    (dict(exponent_bits=5, mantissa_bits=-1), "mantissa_bits must be.*got -1"),
    (dict(exponent_bits=5, mantissa_bits=0), "mantissa_bits must be .* 1 to 23"),
    (dict(exponent_bits=4, mantissa_bits=3, nan="somewhere"), "unknown nan 'somewhere'"),
    (dict(exponent_bits=4, mantissa_bits=3, nan="top"), "nan='ieee' goes with has_inf=True"),
    (dict(exponent_bits=4, mantissa_bits=3, has_inf=False, nan="ieee"), "nan='ieee' goes with"),
    (dict(exponent_bits=4, mantissa_bits=3, has_inf=False, nan="negative_zero", signed=False),
     "needs a sign bit"),
    (dict(exponent_bits=2, mantissa_bits=1, has_inf=False, nan="none", overflow="nan"),
     "overflow='nan' needs a format with a NaN"),
    (dict(exponent_bits=4, mantissa_bits=3, rounding="nearest"), "unknown rounding 'nearest'"),
    (dict(exponent_bits=4, mantissa_bits=3, bias=200), "bias 200 puts values outside float32"),
    (dict(exponent_bits=8, mantissa_bits=7, bias=129), "bias 129 puts values outside float32"),
    (dict(exponent_bits=8, mantissa_bits=7, bias=126), "bias 126 puts values outside float32"),
    (dict(exponent_bits=4, mantissa_bits=3, overflow="wrap"), "unknown overflow 'wrap'"),
    (dict(exponent_bits=4, mantissa_bits=3, has_inf=False, overflow="inf"), "needs a format with inf"),
])
def test_float_format_rejects_impossible_formats(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FloatFormat("bad", **kwargs)


def test_non_saturating_e4m3_turns_overflow_into_nan():
    """The other FP8 convention (the OCP spec's non-saturating mode): overflow is NaN."""
    e4m3_nan = FloatFormat("e4m3_nan", 4, 3, has_inf=False, overflow="nan")
    got = round_to(f32([448.0, 464.0, 465.0, 1e6, math.inf, -500.0]), e4m3_nan)
    assert got[:2].tolist() == [448.0, 448.0] and got[2:].isnan().all()   # 464 is a tie: to 448
    # Below the overflow threshold it rounds exactly like torch's saturating E4M3.
    x = torch.linspace(-460, 460, 10_001)
    assert_same_bits(round_to(x, e4m3_nan), torch_cast(x, FP8_E4M3), x)


@pytest.mark.parametrize("fmt", [FP16, FP8_E4M3, FP8_E5M2], ids=lambda f: f.name)
@pytest.mark.parametrize("fraction", [0.3, 0.05])
def test_stochastic_rounding_is_unbiased_far_below_the_smallest_subnormal(fmt, fraction):
    # Below half the smallest subnormal the only choices are 0 and the smallest subnormal.
    value = fraction * fmt.smallest_subnormal
    x = torch.full((200_000,), value, dtype=torch.float32)
    got = round_to(x, fmt, "stochastic", torch.Generator().manual_seed(1))
    assert set(got.unique().tolist()) <= {0.0, fmt.smallest_subnormal}
    share_up = (got > 0).double().mean().item()
    sigma = (fraction * (1 - fraction) / x.numel()) ** 0.5
    assert abs(share_up - fraction) < 5 * sigma, (share_up, fraction)
