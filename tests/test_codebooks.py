"""8-bit code books against torchao's (a copy of bitsandbytes' create_dynamic_map) and lesson 01's
FP8 rounding."""
import math

import pytest
import torch
from torchao.optim.quant_utils import (create_dynamic_map, dequant_with_qmap,  # the reference
                                       quantize_8bit_with_qmap, scale_tensor)

from mpcourse.optim.codebooks import dequantize_blockwise, dynamic_code, quantize_blockwise
from mpcourse.numbers.formats import FP8_E4M3, FP8_E5M2, round_to


@pytest.mark.parametrize("signed", [True, False])
def test_dynamic_code_is_bitsandbytes_create_dynamic_map(signed):
    ours = dynamic_code(signed)
    assert torch.equal(ours, torch.tensor(create_dynamic_map(signed), dtype=torch.float32))
    assert ours.shape == (256,) and ours.unique().numel() == 256
    assert ours[-1] == 1.0 and (ours.min() == -ours[-2] if signed else ours.min() == 0)
    # seven decades: the smallest non-zero magnitude is about 1e-7
    assert 1e-7 < ours.abs()[ours != 0].min() < 1e-6


@pytest.mark.parametrize("signed, code", [(True, "dynamic"), (False, "dynamic_unsigned")])
@pytest.mark.parametrize("block_size", [64, 256])
def test_dynamic_blockwise_codes_equal_torchao(signed, code, block_size):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 512, generator=g) * torch.logspace(-6, 2, 512)
    if not signed:
        x = x.square()
    codes, scale = quantize_blockwise(x, code, block_size)
    qmap = torch.tensor(create_dynamic_map(signed))
    scaled, their_scale = scale_tensor(x, block_size)
    their_codes = quantize_8bit_with_qmap(scaled, qmap)
    assert codes.dtype == torch.uint8 and codes.shape == x.shape
    assert torch.equal(scale, their_scale) and torch.equal(codes, their_codes)
    assert torch.equal(dequantize_blockwise(codes, scale, code, block_size),
                       dequant_with_qmap(their_codes, qmap, their_scale))


def test_dynamic_codes_are_the_nearest_entry_ties_up():
    book = dynamic_code(True).double()
    x = torch.cat([torch.linspace(-1, 1, 2001), ((book[:-1] + book[1:]) / 2).float()])
    codes, scale = quantize_blockwise(x, "dynamic", block_size=x.numel())
    assert scale.item() == 1.0
    distance = (x.double()[:, None] - book[None, :]).abs()
    nearest = distance.min(dim=1).values
    chosen = distance[torch.arange(len(x)), codes.long()]
    assert torch.allclose(chosen, nearest, rtol=0, atol=1e-7)


@pytest.mark.parametrize("code, fmt", [("e4m3", FP8_E4M3), ("e5m2", FP8_E5M2)])
def test_fp8_codes_are_lesson_01_rounding_of_the_scaled_block(code, fmt):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1000, generator=g) * torch.logspace(-3, 3, 1000)  # 1000 = 3 blocks + 232
    codes, scale = quantize_blockwise(x, code, 256)
    assert codes.shape == x.shape and codes.dtype == fmt.torch_dtype and scale.shape == (4,)
    decoded = dequantize_blockwise(codes, scale, code, 256)
    for b in range(4):
        block = x[b * 256:(b + 1) * 256]
        assert scale[b] == torch.tensor(block.abs().max().item() / fmt.max, dtype=torch.float32)
        assert torch.equal(decoded[b * 256:(b + 1) * 256], round_to(block / scale[b], fmt) * scale[b])


def test_an_outlier_zeroes_its_e4m3_neighbours_and_e5m2_keeps_them():
    """A second moment 1e8 times its neighbours': below E4M3's 2**-9 after scaling, inside
    E5M2's range (57344 / 2**-16, about 2**32)."""
    x = torch.full((256,), 1e-6)
    x[0] = 1e2
    e4m3 = dequantize_blockwise(*quantize_blockwise(x, "e4m3"), "e4m3")
    e5m2 = dequantize_blockwise(*quantize_blockwise(x, "e5m2"), "e5m2")
    assert (e4m3[1:] == 0).all() and math.isclose(FP8_E4M3.smallest_subnormal, 2**-9)
    assert ((e5m2[1:] / 1e-6 - 1).abs() <= 2**-3).all()
    assert math.log2(FP8_E5M2.max / FP8_E5M2.smallest_subnormal) > 31.8


def test_rejects_unknown_codes_and_block_sizes():
    with pytest.raises(ValueError, match="unknown code 'int8'; choose one of e4m3, e5m2"):
        quantize_blockwise(torch.ones(4), "int8")
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        quantize_blockwise(torch.ones(4), "e4m3", 0)


@pytest.mark.parametrize("signed, code", [(True, "dynamic"), (False, "dynamic_unsigned")])
def test_exact_ties_go_to_the_larger_entry_as_torchao_rounds_them(signed, code):
    """Values exactly halfway between two entries (those midpoints a float32 holds exactly):
    torchao sends them up. (bitsandbytes 0.50's pure-torch path, `torch.bucketize` on the
    midpoints, sends them down; the docstring says so.)"""
    book = dynamic_code(signed).double()
    middles = (book[:-1] + book[1:]) / 2
    exact = middles == middles.float().double()
    ties = middles[exact].float()
    assert ties.numel() > 100
    x = torch.cat([ties, torch.ones(1)])  # the 1 makes the block's scale 1: x is its own scaled value
    codes, scale = quantize_blockwise(x, code, block_size=x.numel())
    assert scale.item() == 1.0
    theirs = quantize_8bit_with_qmap(x, torch.tensor(create_dynamic_map(signed)))
    assert torch.equal(codes, theirs)
    assert torch.equal(codes[:-1].long(), torch.arange(255)[exact] + 1), "each tie goes up"
