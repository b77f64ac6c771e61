"""`saturation.clipped_share` against a count made without `blockscale`: each block's floor-rule
scale from math.frexp, and the values above 448 times it counted one by one."""
import math

import pytest
import torch

from mpcourse.lowbit.blockscale import (MXFP4, MXFP4_RCEIL, MXFP8_E4M3, MXFP8_E4M3_RCEIL, PER_TENSOR,
                                         BlockScaling)
from mpcourse.numbers.formats import FP8_E4M3
from mpcourse.lowbit.saturation import clipped_share


def floor_rule_count(x: torch.Tensor, emax: int, element_max: float) -> int:
    """Values above element_max * X, X = 2**(floor(log2 amax) - emax) for each row block of 32."""
    clipped = 0
    for block in x.reshape(-1, 32).tolist():
        amax = max(abs(v) for v in block)
        if amax == 0:
            continue
        _, exponent = math.frexp(amax)              # amax = m * 2**exponent, m in [0.5, 1)
        scale = 2.0 ** (exponent - 1 - emax)
        clipped += sum(abs(v) / scale > element_max for v in block)
    return clipped


@pytest.mark.parametrize("make", [lambda g: torch.rand(64, 128, generator=g) * 2 - 1,
                                  lambda g: torch.randn(64, 128, generator=g) * 30,
                                  lambda g: torch.randn(64, 128, generator=g).pow(3)])
def test_the_floor_rule_clips_the_values_an_independent_count_finds(make):
    x = make(torch.Generator().manual_seed(3))
    assert clipped_share(x, MXFP8_E4M3) == floor_rule_count(x, 8, 448.0) / x.numel()
    assert clipped_share(x, MXFP4) == floor_rule_count(x, 2, 6.0) / x.numel()


def test_round_up_and_current_fp32_scales_clip_nothing():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(4)) * 1e3
    for recipe in (MXFP8_E4M3_RCEIL, MXFP4_RCEIL, PER_TENSOR, BlockScaling("fp32", FP8_E4M3, (1, 32))):
        assert clipped_share(x, recipe) == 0.0, recipe.name


def test_lesson_10s_block_clips_its_three_largest_values():
    block = torch.full((1, 32), 3.0)
    block[0, :4] = torch.tensor([500.0, 460.0, 450.0, 300.0])
    assert clipped_share(block, MXFP8_E4M3) == 3 / 32
    assert clipped_share(-block, MXFP8_E4M3) == 3 / 32          # magnitudes: the sign does not matter
    assert clipped_share(block.reshape(32), MXFP8_E4M3) == 3 / 32  # a 1-D tensor is one row


def test_a_value_exactly_at_the_largest_element_is_not_clipped():
    block = torch.full((1, 32), 1.0)
    block[0, 0] = 448.0                                        # floor: X = 1, 448 / X = 448 exactly
    assert clipped_share(block, MXFP8_E4M3) == 0.0
    block[0, 0] = torch.nan
    assert clipped_share(block, MXFP8_E4M3) == 0.0             # a NaN block decodes to NaN, unclipped
