"""How a narrow accumulator's error grows with the dot product's length K (lesson 10).

A GEMM adds K exact products into a running sum. An accumulator that keeps p mantissa bits
rounds after every addition, by at most one unit in the last kept place of the running sum
(truncation) or half of one (round-to-nearest). Truncation always errs the same way, toward
zero, so its errors add up: a bias that grows like K. Round-to-nearest errs up as often as
down, so its errors partly cancel: they grow like sqrt(K). Promoting the partial sum to FP32
every 128 products restarts the narrow sum from zero, so its error stops growing with K.

`error_against_k` runs one accumulator over the longest K once and reads the running sum at
each shorter K, so a whole curve costs one pass.
"""
from __future__ import annotations

import torch

from mpcourse.numbers.formats import round_to
from mpcourse.lowbit.matmul import Accumulator


def error_against_k(a: torch.Tensor, b: torch.Tensor, accumulator: Accumulator,
                    ks: list[int]) -> dict[int, float]:
    """For the element products of a (M x K) and b (N x K) (exact values, e.g. FP8 elements),
    the largest error of `accumulator`'s sum of the first k products, relative to the largest
    exact |sum|, for each k in `ks` (each a multiple of promote_every, if it is set)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == b.dim() == 2):
        raise ValueError(f"a and b must be 2-D tensors (M x K and N x K), got {_shape(a)} and {_shape(b)}")
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks must be a non-empty list of positive integers, got {ks!r}")
    if a.shape[1] != b.shape[1] or max(ks) > a.shape[1]:
        raise ValueError(f"a is {tuple(a.shape)}, b is {tuple(b.shape)}: they need the same K, "
                         f"at least max(ks) = {max(ks)}")
    chunk = accumulator.promote_every
    if chunk and any(k % chunk for k in ks):
        raise ValueError(f"each K must be a multiple of promote_every={chunk}, got {ks}")
    a64, b64 = a.double(), b.double()
    fmt, rounding = accumulator.format, accumulator.rounding
    narrow = torch.zeros(a.shape[0], b.shape[0])
    promoted = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
    errors = {}
    for k in range(1, max(ks) + 1):
        narrow = round_to(narrow + a[:, k - 1, None] * b[None, :, k - 1], fmt, rounding)
        if chunk and k % chunk == 0:
            promoted, narrow = promoted + narrow.double(), torch.zeros_like(narrow)
        if k in ks:
            exact = a64[:, :k] @ b64[:, :k].t()
            got = promoted + narrow.double()
            errors[k] = ((got - exact).abs().max() / exact.abs().max()).item()
    return errors


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__
