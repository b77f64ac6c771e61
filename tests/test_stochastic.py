"""Stochastic rounding against an independent float64 reference, and the optimizer that uses it."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpcourse.numbers.formats import BF16, FP16, round_to
from mpcourse.numbers.inspect_value import neighbours
from mpcourse.amp.master import MasterWeightOptimizer
from mpcourse.optim.stochastic import StochasticRoundingOptimizer, stochastic_round


def _reference(x: torch.Tensor, fmt, r: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding of normal values in float64: the neighbours lo < |x| <= hi of the
    format and the fraction p = (|x| - lo) / (hi - lo); with d dropped bits, the random draw
    r in [0, 2**d) rounds up exactly when p * 2**d + r >= 2**d."""
    d = 23 - fmt.mantissa_bits
    out = []
    for value, draw in zip(x.double().tolist(), r.tolist()):
        magnitude = abs(value)
        spacing = 2.0 ** (math.floor(math.log2(magnitude)) - fmt.mantissa_bits)
        lo = math.floor(magnitude / spacing) * spacing
        fraction_bits = (magnitude - lo) / spacing * 2**d  # an integer: x is a float32
        up = fraction_bits + (draw % 2**d) >= 2**d
        out.append(math.copysign(lo + spacing if up else lo, value))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=lambda f: f.name)
def test_fixed_random_bits_give_the_float64_reference_bit_for_bit(fmt):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, generator=g) * 10.0 ** torch.randint(-3, 4, (4000,), generator=g)
    x = x.clamp(-60000, 60000)
    x = x[x.abs() > 1e-4]  # normal in FP16 too
    r = torch.randint(0, 2**25, x.shape, generator=g, dtype=torch.int32)
    got = stochastic_round(x, fmt, random_bits=r)
    assert torch.equal(got.double(), _reference(x, fmt, r))


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=2**-126, max_value=2.0**127, width=32), st.booleans(),
       st.integers(min_value=0, max_value=2**25 - 1))
def test_any_normal_bf16_value_and_bits_match_the_reference(magnitude, negative, r):
    x = torch.tensor([-magnitude if negative else magnitude])
    bits = torch.tensor([r], dtype=torch.int32)
    assert torch.equal(stochastic_round(x, BF16, random_bits=bits).double(), _reference(x, BF16, bits))


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=lambda f: f.name)
def test_zero_bits_truncate_and_all_ones_round_away_from_zero(fmt):
    x = torch.tensor([1.0 + 2**-12, -3.3, 0.1, 1.0, -2.5e-3])
    zeros = torch.zeros_like(x, dtype=torch.int32)
    ones = torch.full_like(x, 2**25 - 1, dtype=torch.int32)
    truncated = round_to(x, fmt, rounding="toward_zero")
    assert torch.equal(stochastic_round(x, fmt, random_bits=zeros), truncated)
    away = stochastic_round(x, fmt, random_bits=ones)
    exact = round_to(x, fmt, rounding="toward_zero") == x
    assert torch.equal(away[exact], x[exact])
    assert (away[~exact].abs() > x[~exact].abs()).all()
    assert (away[~exact].abs() < x[~exact].abs() * (1 + 2 * fmt.eps)).all()


def test_stochastic_rounding_is_unbiased():
    n = 20_000
    for value in (1.0 + 2**-10, 1.0 + 0.3 * 2**-7, -7.77, 3e-3):
        x = torch.full((n,), value)
        draws = stochastic_round(x, BF16, generator=torch.Generator().manual_seed(1)).double()
        lo, hi = draws.min().item(), draws.max().item()
        assert set(draws.unique().tolist()) <= {lo, hi}, "only the two neighbours"
        p = (abs(value) - min(abs(lo), abs(hi))) / abs(hi - lo)
        sigma = abs(hi - lo) * math.sqrt(p * (1 - p) / n)
        assert abs(draws.mean().item() - value) < 5 * sigma, f"mean of {value} drifted"


def _sgd_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter((1 + torch.rand(256, generator=g)).bfloat16())
    grad = (torch.randn(256, generator=g) * 1e-3).bfloat16()
    return weight, grad


def test_optimizer_rounds_the_exact_update_to_a_neighbour():
    lr = 0.5
    weight, grad = _sgd_problem()
    exact = weight.detach().double() - lr * grad.double()  # exact in FP32, as the inner SGD
    optimizer = StochasticRoundingOptimizer([weight], torch.optim.SGD,
                                            generator=torch.Generator().manual_seed(2), lr=lr)
    weight.grad = grad.clone()
    optimizer.step()
    stored = weight.detach().double()
    lo = round_to(exact.float(), BF16, rounding="toward_zero").double()
    spacing = 2.0 ** (torch.floor(torch.log2(lo)) - 7)
    assert ((stored == lo) | (stored == lo + spacing)).all()
    assert ((stored == lo + spacing) & (exact == lo)).sum() == 0, "exact results stay exact"
    assert optimizer.state[weight] == {} and all(
        p.numel() == 0 for group in optimizer.param_groups for p in group["params"]), \
        "no FP32 copy survives the step"


def test_small_updates_survive_on_average_where_nearest_rounding_drops_them():
    lr, steps = 0.1, 300  # updates of about 1e-4, below half bf16's gap of 2**-7 in [1, 2)
    start, grad = _sgd_problem(seed=3)
    results = {}
    for name in ("nearest", "stochastic", "master"):
        weight = torch.nn.Parameter(start.detach().clone())
        if name == "nearest":
            optimizer = torch.optim.SGD([weight], lr=lr)
        elif name == "stochastic":
            optimizer = StochasticRoundingOptimizer([weight], torch.optim.SGD, lr=lr,
                                                    generator=torch.Generator().manual_seed(4))
        else:
            optimizer = MasterWeightOptimizer([weight], torch.optim.SGD, lr=lr)
        for _ in range(steps):
            weight.grad = grad.clone()
            optimizer.step()
        results[name] = (optimizer.master_parameters()[0] if name == "master" else weight).detach()
    exact = start.double() - steps * lr * grad.double()
    assert torch.equal(results["nearest"], start.detach()), "each update is below half a gap"
    # Regress the stochastic movement on the exact one: the slope is 1 when unbiased. Each weight's
    # noise is about 2**-7 * sqrt(steps * 1e-4 / 2**-7) = 0.015 against a movement of 0.03, so
    # over 256 weights the slope's standard error is about 3%.
    moved, wanted = results["stochastic"].double() - start.double(), exact - start.double()
    slope = (moved * wanted).sum() / (wanted * wanted).sum()
    assert abs(slope - 1) < 0.15, f"stochastic rounding moved the weights {slope:.2f}x the exact"
    assert torch.allclose(results["master"].double(), exact, rtol=0, atol=1e-4)


def test_rejects_weights_it_cannot_round():
    with pytest.raises(ValueError, match="16-bit weights.*float32"):
        StochasticRoundingOptimizer([torch.nn.Parameter(torch.ones(2))], torch.optim.SGD, lr=1)
    with pytest.raises(ValueError, match="empty parameter list"):
        StochasticRoundingOptimizer([], torch.optim.SGD, lr=1)


def test_stochastic_sgd_rounds_to_a_neighbour_and_is_right_on_average():
    weight = torch.nn.Parameter(torch.ones(20_000, dtype=torch.bfloat16))
    weight.grad = torch.full_like(weight, 1.0)
    StochasticRoundingOptimizer([weight], torch.optim.SGD, lr=1e-3,
                                generator=torch.Generator().manual_seed(0)).step()
    values = set(weight.detach().float().unique().tolist())
    assert values == {neighbours(0.999, BF16)[0], 1.0}, values
    assert weight.detach().double().mean().item() == pytest.approx(0.999, abs=2e-4)
    assert weight.dtype == torch.bfloat16
    untouched = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))  # no gradient: left alone
    StochasticRoundingOptimizer([untouched], torch.optim.SGD, lr=1e-3).step()
    assert torch.equal(untouched.detach(), torch.ones(3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float32"):
        StochasticRoundingOptimizer([torch.nn.Parameter(torch.ones(2))], torch.optim.SGD, lr=0.1)
