"""error_against_k against scaled_matmul's reduced accumulator, and the growth laws it shows."""
import pytest
import torch

from mpcourse.lowbit.accumulation import error_against_k
from mpcourse.lowbit.blockscale import PER_TENSOR, Quantized, quantize
from mpcourse.lowbit.matmul import Accumulator, scaled_matmul


def operands(k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (quantize(torch.randn(4, k, generator=g), PER_TENSOR),
            quantize(torch.randn(4, k, generator=g), PER_TENSOR))


@pytest.mark.parametrize("accumulator", [Accumulator(14), Accumulator(14, "nearest_even"),
                                         Accumulator(10, promote_every=128)], ids=str)
def test_each_point_is_scaled_matmuls_error_at_that_k(accumulator):
    a, b = operands(512)
    errors = error_against_k(a.elements, b.elements, accumulator, [256, 512])
    for k in (256, 512):
        qa = Quantized(a.elements[:, :k], a.scales, a.tensor_scale, PER_TENSOR)
        qb = Quantized(b.elements[:, :k], b.scales, b.tensor_scale, PER_TENSOR)
        out = scaled_matmul(qa, qb, accumulator).double() / (qa.scales * qb.scales).item()
        exact = qa.elements.double() @ qb.elements.double().t()
        expected = ((out - exact).abs().max() / exact.abs().max()).item()
        assert errors[k] == pytest.approx(expected, rel=1e-3, abs=1e-6)   # scaled_matmul returns FP32


def test_truncation_grows_faster_than_rounding_and_promotion_stops_the_growth():
    a, b = operands(4096, seed=1)
    ks = [256, 4096]
    trunc = error_against_k(a.elements, b.elements, Accumulator(10), ks)
    nearest = error_against_k(a.elements, b.elements, Accumulator(10, "nearest_even"), ks)
    promoted = error_against_k(a.elements, b.elements, Accumulator(10, promote_every=128), ks)
    assert trunc[4096] > 4 * trunc[256]                  # a bias: grows about like K
    assert nearest[4096] < trunc[4096] / 5               # cancelling errors: far smaller
    assert promoted[4096] < trunc[4096] / 10
    with pytest.raises(ValueError, match="multiple of promote_every=128"):
        error_against_k(a.elements, b.elements, Accumulator(10, promote_every=128), [100])
