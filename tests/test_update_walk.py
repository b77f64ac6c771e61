"""The single-weight walks of lesson 11 against exact arithmetic and the binomial spread."""
import math

import pytest
import torch

from mpcourse.amp.update_walk import stochastic_spread, walk

START, UPDATE, STEPS = 1.0, 5e-5, 4000  # updates far below half bf16's gap in [1, 2), 2**-8


def test_nearest_loses_every_update_and_the_master_keeps_them(one_thread):
    assert (walk(START, UPDATE, STEPS, "nearest") == START).all()
    master = walk(START, UPDATE, STEPS, "master")[-1].item()
    # The FP32 sum is off by at most STEPS * 2**-24 (one rounding per step, below 2), and the
    # weight in use is that sum rounded to bf16: within half a gap, 2**-8.
    assert abs(master - (START + STEPS * UPDATE)) <= 2**-8 + STEPS * 2**-24


def test_kahan_keeps_the_sum_within_its_compensation_rounding(one_thread):
    final = walk(START, UPDATE, STEPS, "kahan")[-1].item()
    exact = START + STEPS * UPDATE
    # The compensation stays below half the gap (2**-8) and each step rounds it to bf16, losing
    # at most 2**-9 of it; the weight itself is within half a gap of weight + compensation.
    assert abs(final - exact) <= STEPS * 2**-17 + 2**-8


def test_stochastic_walks_are_unbiased_with_the_binomial_spread(one_thread):
    n = 2000
    final = walk(START, UPDATE, STEPS, "stochastic", n=n,
                 generator=torch.Generator().manual_seed(0))[-1]
    spread = stochastic_spread(START, UPDATE, STEPS)
    assert spread == pytest.approx(2**-7 * math.sqrt(STEPS * (UPDATE / 2**-7) * (1 - UPDATE / 2**-7)))
    assert abs(final.mean().item() - (START + STEPS * UPDATE)) < 5 * spread / math.sqrt(n)
    assert final.std().item() == pytest.approx(spread, rel=0.15)


def test_records_every_kth_step_and_rejects_bad_input():
    assert walk(START, UPDATE, 100, "master", n=3, record_every=10).shape == (11, 3)
    with pytest.raises(ValueError, match="unknown cure 'fp64'"):
        walk(START, UPDATE, 10, "fp64")
    with pytest.raises(ValueError, match="larger than the gap"):
        stochastic_spread(1.0, 0.1, 10)
