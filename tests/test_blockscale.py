"""Block scaling (per tensor, per row, tiles, blocks, MX, NVFP4) against the specs' rules and
torch's and ml_dtypes' casts."""
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from mpcourse.lowbit.blockscale import (AMAX_FLOOR, BLOCK_128x128, MXFP4, MXFP4_RCEIL, MXFP6_E2M3,
                                         MXFP8_E4M3, MXFP8_E4M3_RCEIL, MXFP8_E5M2, NVFP4, NVFP4_16x16,
                                         PER_ROW, PER_TENSOR, RECIPES, TILE_1x128, BlockScaling, block_amax,
                                         fake_quantize, mx_scale, nvfp4_tensor_scale, quantize, snr_db)
from mpcourse.numbers.formats import FP4_E2M1, FP8_E4M3, FP8_E8M0

MX = (MXFP8_E4M3, MXFP8_E5M2, MXFP6_E2M3, MXFP4)


def spec_mx_scale(amax: float, emax_elem: int) -> float:
    """OCP MX v1.0: X = 2**(floor(log2(amax)) - emax_elem), clamped to E8M0's 2**-127..2**127."""
    if math.isnan(amax) or math.isinf(amax):
        return math.nan
    if amax == 0:
        return 2.0**-127
    return 2.0 ** min(max(math.floor(math.log2(amax)) - emax_elem, -127), 127)


def activations(rows=256, cols=256, seed=0) -> torch.Tensor:
    """Gaussian values with a few outlier columns, as in transformer activations."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    x[:, torch.randint(0, cols, (4,), generator=g)] *= 100
    return x


@pytest.mark.parametrize("recipe", MX, ids=lambda r: r.name)
def test_mx_scale_is_the_spec_rule_and_an_exact_e8m0_value(recipe):
    emax = {MXFP8_E4M3: 8, MXFP8_E5M2: 15, MXFP6_E2M3: 2, MXFP4: 2}[recipe]
    g = torch.Generator().manual_seed(1)
    amax = torch.cat([torch.rand(2000, generator=g) * 10.0 ** torch.randint(-44, 38, (2000,), generator=g),
                      torch.tensor([0.0, 1e-45, 2.0**-130, 1.0, 448.0, 449.0, 3e38, math.inf, math.nan])])
    got = mx_scale(amax, recipe.element)
    expected = torch.tensor([spec_mx_scale(a, emax) for a in amax.tolist()])
    assert torch.equal(got.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert torch.equal(got[finite], expected[finite])
    assert torch.equal(got[finite].to(torch.float8_e8m0fnu).float(), got[finite])   # exact in E8M0


def _exact_mx_scale(amax: float, element, rule: str) -> float:
    """The rule in exact rational arithmetic (an independent reference): floor gives
    2**(floor(log2 amax) - emax); round-up the smallest power of two >= amax / element.max;
    both clamped to E8M0's 2**-127 .. 2**127; zero amax gives 2**-127."""
    if amax == 0:
        return 2.0**-127
    target = Fraction(amax) if rule == "mx_floor" else Fraction(amax) / Fraction(element.max)
    power = -200
    while Fraction(2) ** (power + 1) <= target:   # the largest power of two <= target
        power += 1
    if rule == "mx_floor":
        power -= element.max_exponent
    elif Fraction(2) ** power < target:
        power += 1
    return 2.0 ** min(max(power, -127), 127)


@pytest.mark.parametrize("element", [FP8_E4M3, FP4_E2M1], ids=lambda e: e.name)
@pytest.mark.parametrize("rule", ["mx_floor", "mx_rceil"])
def test_mx_scale_at_float32_subnormal_and_tiny_amaxes_matches_exact_arithmetic(rule, element):
    """Blocks of float32 subnormals: amax / element.max underflows float32 to 0 below about
    element.max * 2**-150, and the round-up rule must still give 2**-127 (E8M0 code 0), not 1."""
    generator = torch.Generator().manual_seed(5)
    subnormal = torch.rand(200, generator=generator) * 2.0**-126
    tiny = torch.tensor([2.0**-149, 2.0**-140, 1e-45, 1e-42, 1e-40, 2.0**-126, 2.0**-120, 3e-36, 0.0])
    normal = torch.exp2(torch.rand(200, generator=generator) * 250 - 125)
    amaxes = torch.cat([subnormal, tiny, normal])
    got = mx_scale(amaxes, element, rule)
    expected = torch.tensor([_exact_mx_scale(a, element, rule) for a in amaxes.tolist()])
    assert torch.equal(got, expected)
    assert (got[: subnormal.numel()] == 2.0**-127).all()


@pytest.mark.parametrize("recipe", MX, ids=lambda r: r.name)
def test_mx_elements_are_the_saturating_cast_of_x_over_the_block_scale(recipe):
    x = activations(8, 128)
    q = quantize(x, recipe)
    assert q.scales.shape == (8, 4)
    full = q.scales.repeat_interleave(32, 1)
    scaled = (x / full).clamp(-recipe.element.max, recipe.element.max).numpy()
    reference = {MXFP8_E4M3: ml_dtypes.float8_e4m3fn, MXFP8_E5M2: ml_dtypes.float8_e5m2,
                 MXFP6_E2M3: ml_dtypes.float6_e2m3fn, MXFP4: ml_dtypes.float4_e2m1fn}[recipe]
    expected = torch.from_numpy(scaled.astype(reference).astype(np.float32))
    assert torch.equal(q.elements, expected)
    assert torch.equal(q.dequantize(), expected * full)
    # Saturation happens: the floor rule lets amax / X reach up to 2**(emax + 1) > element.max.
    assert q.elements.abs().max() == recipe.element.max


def test_current_scaling_per_tensor_and_tiles_cast_x_over_amax_like_torch():
    x = activations(4, 256)
    for recipe, blocks in ((PER_TENSOR, x.abs().max().reshape(1, 1)),
                           (TILE_1x128, x.abs().reshape(4, 2, 128).amax(2))):
        q = quantize(x, recipe)
        assert torch.equal(q.scales, blocks / 448.0)
        full = q.scales.repeat_interleave(x.shape[1] // q.scales.shape[1], 1)
        assert torch.equal(q.elements, (x / full).to(torch.float8_e4m3fn).float())
        assert q.elements.abs().amax(1).max() == 448.0     # each block's amax lands on 448


def test_per_row_scales_are_powers_of_two_that_keep_amax_in_range():
    x = activations(64, 64) * 0.37
    q = quantize(x, PER_ROW)
    _, exponent = torch.frexp(q.scales)
    assert torch.equal(q.scales, torch.ldexp(torch.full_like(q.scales, 0.5), exponent))   # powers of two
    ratio = x.abs().amax(1, keepdim=True) / q.scales
    assert ((ratio > 224) & (ratio <= 448)).all()
    assert torch.equal(q.dequantize(), q.elements * q.scales)   # exact: power-of-two scales


def test_128x128_blocks_have_one_scale_per_block():
    x = activations(256, 384)
    q = quantize(x, BLOCK_128x128)
    assert q.scales.shape == (2, 3)
    assert torch.equal(q.scales, x.abs().reshape(2, 128, 3, 128).amax((1, 3)) / 448.0)


def test_nvfp4_has_an_fp32_tensor_scale_and_e4m3_block_scales():
    x = activations(16, 64)
    q = quantize(x, NVFP4)
    assert q.tensor_scale == x.abs().max() / (448 * 6)
    block_amax_ = x.abs().reshape(16, 4, 16).amax(2)
    expected = (block_amax_ / 6 / q.tensor_scale).to(torch.float8_e4m3fn).float()
    assert torch.equal(q.scales, expected)
    full = (q.scales * q.tensor_scale).repeat_interleave(16, 1)
    fp4 = torch.from_numpy((x / full).clamp(-6, 6).numpy().astype(ml_dtypes.float4_e2m1fn)
                           .astype(np.float32))
    assert torch.equal(q.elements, fp4)
    assert torch.equal(q.dequantize(), fp4 * full)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_an_all_zero_block_gets_a_finite_nonzero_scale_and_decodes_to_zero(recipe):
    x = activations(128, 128)
    x[:, :32] = 0.0
    x[0] = 0.0
    if recipe is PER_TENSOR or recipe is BLOCK_128x128:
        x = torch.zeros(128, 128)
    q = quantize(x, recipe)
    assert q.scales.isfinite().all() and ((q.scales > 0).all() or recipe.tensor_scale)
    dequantized = q.dequantize()
    assert dequantized.isfinite().all()
    assert (dequantized[x == 0] == 0).all()


def test_a_block_with_inf_or_nan_decodes_to_nan_and_spares_the_other_blocks():
    x = activations(2, 64)
    x[0, 3], x[1, 40] = math.inf, math.nan
    q = quantize(x, MXFP8_E4M3)
    assert q.scales[0, 0].isnan() and q.scales[1, 1].isnan()
    out = q.dequantize()
    assert out[0, :32].isnan().all() and out[1, 32:].isnan().all()
    assert out[0, 32:].isfinite().all() and out[1, :32].isfinite().all()


def test_delayed_scaling_uses_the_given_amax_and_saturates_what_grew():
    x = activations(4, 64)
    history_amax = x.abs().max() / 2        # last steps' amax: half of today's
    q = quantize(x, PER_TENSOR, amax=history_amax.reshape(1, 1))
    assert q.scales.item() == (history_amax / 448.0).item()
    assert (q.elements.abs() == 448.0).sum() > 1       # values above the old amax saturate
    assert snr_db(x, PER_TENSOR, amax=history_amax.reshape(1, 1)) < snr_db(x, PER_TENSOR) - 3


def test_finer_blocks_give_fp4_a_better_snr_on_rows_of_different_scales():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-3, 3, 64)[:, None]
    snrs = [snr_db(x, BlockScaling(name, FP4_E2M1, block))
            for name, block in (("tensor", (None, None)), ("row", (1, None)), ("32", (1, 32)),
                                ("16", (1, 16)))]
    assert snrs == sorted(snrs) and snrs[-1] - snrs[0] > 3


def test_fake_quantize_keeps_shape_and_dtype_and_takes_leading_dimensions_as_rows():
    x = activations(8, 64).reshape(2, 4, 64).bfloat16()
    y = fake_quantize(x, MXFP8_E4M3)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert torch.equal(y.float().reshape(8, 64), quantize(x.float(), MXFP8_E4M3).dequantize().bfloat16().float())
    assert block_amax(x.float().reshape(8, 64), MXFP4).shape == (8, 2)


def test_an_all_zero_tensor_takes_its_scale_from_the_amax_floor_not_from_zero():
    q = quantize(torch.zeros(4, 8), PER_TENSOR)
    assert q.scales.item() == (torch.tensor(AMAX_FLOOR) / 448.0).item() > 0
    assert torch.equal(q.elements, torch.zeros(4, 8))


@pytest.mark.parametrize("kwargs, message", [
    (dict(block=(1, 32), scale_format=FP8_E8M0), "rules go with E8M0 scales and only with them, got rule 'amax'"),
    (dict(block=(1, 32), rule="mx_floor"), "rules go with E8M0"),
    (dict(block=(1, 32), rule="mx_rceil"), "rules go with E8M0"),
    (dict(block=(1, 32), rule="floor"), "unknown rule 'floor'"),
    (dict(block=(1, 16), scale_format=FP8_E4M3), "need an FP32 tensor scale"),
    (dict(block=(1, 0)), "positive integer or None"),
    (dict(block=(1, 32), scale_format=FP4_E2M1), "fp32, fp8_e8m0 or fp8_e4m3, got fp4_e2m1"),
])
def test_block_scaling_rejects_impossible_recipes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BlockScaling("bad", FP8_E4M3, **kwargs)


def test_quantize_rejects_blocks_that_do_not_tile_the_tensor():
    with pytest.raises(ValueError, match="blocks of 1x32 don't tile a 4x48 tensor"):
        quantize(torch.ones(4, 48), MXFP8_E4M3)
    with pytest.raises(ValueError, match="floating-point tensor"):
        quantize(torch.ones(4, 32, dtype=torch.int32), MXFP8_E4M3)


def test_snr_where_counts_only_the_masked_values_next_to_an_outlier():
    x = activations(64, 64, seed=3)
    x[:, 0] = 1e4                               # one huge channel sets every scale per tensor
    ordinary = torch.ones_like(x, dtype=torch.bool)
    ordinary[:, 0] = False
    recipe = BlockScaling("fp4 per tensor", FP4_E2M1, (None, None))
    error = x - fake_quantize(x, recipe)
    by_hand = 10 * math.log10(x[ordinary].double().pow(2).sum() / error[ordinary].double().pow(2).sum())
    assert snr_db(x, recipe, ordinary) == pytest.approx(by_hand, rel=1e-12)
    assert snr_db(x, recipe, ordinary) < 1 < 10 < snr_db(x, recipe)   # the outlier hides the damage


def rceil_by_casts(amax: torch.Tensor, element_max: float) -> torch.Tensor:
    """The round-up rule from torch's own casts, independently of mx_scale: the E8M0 cast of
    amax / element.max is the nearest power of two; if that lies below the quotient, the next
    one up. (For quotients in float32's normal range, where torch's cast rounds to nearest.)"""
    descale = amax / element_max
    nearest = descale.to(torch.float8_e8m0fnu).float()
    return torch.where(nearest < descale, nearest * 2, nearest)


@pytest.mark.parametrize("recipe", (MXFP8_E4M3_RCEIL, MXFP4_RCEIL), ids=lambda r: r.name)
def test_the_round_up_rule_is_the_power_of_two_at_or_above_amax_over_max_and_never_clips(recipe):
    g = torch.Generator().manual_seed(4)
    amax = torch.cat([torch.rand(3000, generator=g) * 10.0 ** torch.randint(-30, 30, (3000,), generator=g),
                      torch.tensor([1.0, 448.0, 449.0, 500.0, 6.0, 6.5, 8.0, 2.0**-100])])
    got = mx_scale(amax, recipe.element, "mx_rceil")
    assert torch.equal(got, rceil_by_casts(amax, recipe.element.max))
    assert mx_scale(torch.tensor([0.0]), recipe.element, "mx_rceil").item() == 2.0**-127
    assert mx_scale(torch.tensor([math.inf]), recipe.element, "mx_rceil").isnan().all()
    # On a block: the floor rule clips the elements between element.max and 2**(emax+1); RCEIL none.
    x = activations(64, 128) * 0.77
    floor_rule = BlockScaling("floor", recipe.element, (1, 32), FP8_E8M0, "mx_floor")
    q_floor, q_rceil = quantize(x, floor_rule), quantize(x, recipe)
    scaled = (x / q_rceil.block_scales()).abs()
    assert scaled.max() <= recipe.element.max and (scaled.amax(1) > recipe.element.max / 2).all()
    torch_cast = {MXFP8_E4M3_RCEIL: torch.float8_e4m3fn}.get(recipe)
    if torch_cast is not None:   # elements: torch's saturating cast, nothing saturating
        assert torch.equal(q_rceil.elements, (x / q_rceil.block_scales()).to(torch_cast).float())
    clipped_floor = ((x / q_floor.block_scales()).abs() > recipe.element.max).sum()
    assert clipped_floor > 0
    assert (q_rceil.scales >= q_floor.scales).all() and (q_rceil.scales <= 2 * q_floor.scales).all()
    with pytest.raises(ValueError, match="unknown MX scale rule 'even'"):
        mx_scale(amax, recipe.element, "even")


def test_nvfp4_at_amax_1e_20_matches_an_independent_computation_and_keeps_its_snr():
    x = activations(16, 64)
    tiny = (x / x.abs().max() * 1e-20).float()
    q = quantize(tiny, NVFP4)
    # Independently, in numpy with ml_dtypes' casts (float32 arithmetic, as the kernels do).
    t = tiny.numpy()
    tensor_scale = np.float32(np.abs(t).max()) / np.float32(448 * 6)
    block_amax_ = np.abs(t).reshape(16, 4, 16).max(2)
    block_scale = (block_amax_ / np.float32(6) / tensor_scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    full = np.repeat(block_scale * tensor_scale, 16, axis=1)
    elements = np.clip(t / full, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert q.tensor_scale.item() == tensor_scale
    assert torch.equal(q.scales, torch.from_numpy(block_scale))
    assert torch.equal(q.elements, torch.from_numpy(elements))
    assert block_scale.max() == 448                # the largest block scale uses E4M3's top
    # Scale-invariant: NVFP4 at amax 1e-20 keeps the SNR it has at amax 1 (float32 rounding aside).
    unit = x / x.abs().max()
    assert snr_db(tiny, NVFP4) == pytest.approx(snr_db(unit, NVFP4), abs=0.05)
    assert snr_db(tiny, NVFP4) > 15


def test_nvfp4_tensor_scale_treats_only_a_zero_amax_specially():
    assert nvfp4_tensor_scale(torch.tensor(0.0)).item() == 1.0
    for amax in (1e-20, 1e-13, 1.0, 3e4):
        assert nvfp4_tensor_scale(torch.tensor(amax)).item() == (torch.tensor(amax) / 2688).item()
    assert nvfp4_tensor_scale(torch.tensor(1e-44)).item() > 0          # underflow kept finite
    q = quantize(torch.full((2, 16), 1e-44), NVFP4)
    assert q.dequantize().isfinite().all()


@pytest.mark.parametrize("recipe, transposes", [(NVFP4_16x16, True), (BLOCK_128x128, True),
                                                (PER_TENSOR, True), (NVFP4, False), (MXFP8_E4M3, False)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_square_blocks_let_one_quantized_weight_serve_w_and_its_transpose(recipe, transposes):
    w = activations(256, 256, seed=5) * torch.logspace(-2, 1, 256)[:, None]
    of_w_transposed = fake_quantize(w, recipe).t()
    of_transpose = fake_quantize(w.t().contiguous(), recipe)
    assert recipe.transposes_exactly == transposes
    assert torch.equal(of_w_transposed, of_transpose) == transposes
