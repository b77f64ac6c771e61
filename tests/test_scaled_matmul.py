"""The emulated scaled matmul against torch._scaled_mm, float64, and accumulators built from
torch's own casts."""
import pytest
import torch

from mpcourse.lowbit.blockscale import (BLOCK_128x128, MXFP4, MXFP8_E4M3, NVFP4, PER_ROW, PER_TENSOR,
                                         TILE_1x128, BlockScaling, quantize)
from mpcourse.numbers.formats import FP8_E5M2
from mpcourse.lowbit.matmul import FP32_ACCUMULATOR, Accumulator, scaled_matmul
from mpcourse.lowbit.torch_mm import torch_scaled_mm

PER_ROW_E5M2 = BlockScaling("per-row E5M2", FP8_E5M2, (1, None))


def operands(m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g) * 3, torch.randn(n, k, generator=g) * 0.02


def error_bound(qa, qb) -> torch.Tensor:
    """Two FP32 sums of the same exact products, in any order, differ by at most
    2 * K * 2**-24 * sum |a_k b_k| (each is within gamma_K of the exact sum; Higham, 2002),
    plus a few roundings of the scale multiplications."""
    k = qa.elements.shape[1]
    magnitude = qa.dequantize().abs().double() @ qb.dequantize().abs().double().t()
    return (2 * k + 4) * 2.0**-24 * magnitude


@pytest.mark.parametrize("recipe_a, recipe_b", [(PER_TENSOR, PER_TENSOR), (PER_ROW, PER_ROW),
                                                (PER_ROW_E5M2, PER_ROW)],
                         ids=["tensorwise", "rowwise", "rowwise-e5m2-grad"])
@pytest.mark.parametrize("k", [64, 1024])
def test_fp32_accumulation_agrees_with_torch_scaled_mm(recipe_a, recipe_b, k):
    a, b = operands(48, 40, k)
    qa, qb = quantize(a, recipe_a), quantize(b, recipe_b)
    ours, torchs = scaled_matmul(qa, qb), torch_scaled_mm(qa, qb)
    assert ours.dtype == torchs.dtype == torch.float32 and ours.shape == (48, 40)
    assert ((ours.double() - torchs.double()).abs() <= error_bound(qa, qb)).all()
    exact = qa.dequantize().double() @ qb.dequantize().double().t()
    assert ((ours.double() - exact).abs() <= error_bound(qa, qb)).all()
    # The bound is not vacuous: the FP8 error itself is far outside it.
    assert ((a.double() @ b.double().t() - exact).abs() > error_bound(qa, qb)).any()


@pytest.mark.parametrize("recipe_a, recipe_b", [(MXFP8_E4M3, MXFP8_E4M3), (MXFP4, MXFP4),
                                                (NVFP4, NVFP4), (TILE_1x128, BLOCK_128x128),
                                                (PER_TENSOR, MXFP8_E4M3)],
                         ids=["mxfp8", "mxfp4", "nvfp4", "deepseek", "mixed"])
def test_block_scaled_matmul_is_the_product_of_the_dequantized_operands(recipe_a, recipe_b):
    a, b = operands(128, 256, 512, seed=1)
    qa, qb = quantize(a, recipe_a), quantize(b, recipe_b)
    exact = qa.dequantize().double() @ qb.dequantize().double().t()
    assert ((scaled_matmul(qa, qb).double() - exact).abs() <= error_bound(qa, qb)).all()


def cast_accumulated(a, b, dtype, chunk=None):
    """Sum a[:, k] b[:, k] one k at a time, rounding the running sum with torch's cast to
    `dtype` after each addition; with `chunk`, promote each chunk's sum to a float64 total."""
    k = a.shape[1]
    chunk = chunk or k
    total = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
    for start in range(0, k, chunk):
        running = torch.zeros(a.shape[0], b.shape[0])
        for i in range(start, start + chunk):
            running = (running + a[:, i, None] * b[None, :, i]).to(dtype).float()
        total += running.double()
    return total


@pytest.mark.parametrize("mantissa_bits, dtype", [(7, torch.bfloat16), (23, torch.float32)])
def test_a_reduced_accumulator_rounds_like_a_cast_after_every_addition(mantissa_bits, dtype):
    a, b = operands(4, 5, 96, seed=2)
    qa, qb = quantize(a, PER_TENSOR), quantize(b, PER_TENSOR)
    scale = qa.scales * qb.scales
    got = scaled_matmul(qa, qb, Accumulator(mantissa_bits, "nearest_even", promote_every=96))
    expected = cast_accumulated(qa.elements, qb.elements, dtype).float() * qa.scales * qb.scales
    assert torch.equal(got, expected)   # the partial sum times scale a, times scale b
    promoted = scaled_matmul(qa, qb, Accumulator(mantissa_bits, "nearest_even", promote_every=32))
    expected = cast_accumulated(qa.elements, qb.elements, dtype, chunk=32)
    assert ((promoted.double() - expected * scale.double()).abs() <= error_bound(qa, qb)).all()


def test_truncation_loses_more_than_rounding_and_promotion_recovers_it():
    """DeepSeek-V3's experiment in miniature: K = 1024, 14 mantissa bits, promotion every 128."""
    a, b = operands(4, 4, 1024, seed=3)
    qa, qb = quantize(a.abs(), PER_TENSOR), quantize(b.abs(), PER_TENSOR)
    exact = qa.dequantize().double() @ qb.dequantize().double().t()

    def worst(acc):
        return ((scaled_matmul(qa, qb, acc).double() - exact).abs() / exact.abs()).max().item()
    truncated, rounded = worst(Accumulator(14)), worst(Accumulator(14, "nearest_even"))
    promoted = worst(Accumulator(14, promote_every=128))
    assert promoted < rounded < truncated
    assert truncated > 2**-14 * 10 and promoted < truncated / 4


def test_bad_input_is_rejected():
    a, b = operands(4, 4, 64)
    with pytest.raises(ValueError, match="both must have K = 64"):
        scaled_matmul(quantize(a, PER_TENSOR), quantize(b[:, :32], PER_TENSOR))
    with pytest.raises(ValueError, match="scales change every 32 elements.*promote_every=None"):
        scaled_matmul(quantize(a, MXFP8_E4M3), quantize(b, MXFP8_E4M3), Accumulator(14))
    with pytest.raises(ValueError, match="does not pair BlockWise1x32 \\(a\\) with TensorWise"):
        torch_scaled_mm(quantize(a, MXFP8_E4M3), quantize(b, PER_TENSOR))
    with pytest.raises(ValueError, match="no layout for MXFP4"):
        torch_scaled_mm(quantize(a, MXFP4), quantize(b, MXFP4))
    with pytest.raises(ValueError, match=r"mantissa_bits must be an integer from 1 to 23 \(float32\), got 30"):
        Accumulator(30)
    with pytest.raises(ValueError, match="rounding must be"):
        Accumulator(14, "stochastic")
    with pytest.raises(ValueError, match="promote_every must be a positive integer"):
        Accumulator(14, promote_every=0)
    assert str(FP32_ACCUMULATOR) == "FP32 accumulator"
    assert str(Accumulator(13, promote_every=128)) == \
        "14-bit significand accumulator, promoted to FP32 every 128"
