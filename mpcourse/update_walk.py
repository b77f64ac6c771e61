"""One weight, many small updates: what each cure for vanishing updates keeps (lesson 11).

`walk` adds the same update to a 16-bit weight step after step and records the weight, the way
an optimizer would with a constant gradient. The cures differ only in how each sum is stored:

- ``"nearest"``: rounded to nearest in the format: an update below half the gap is lost;
- ``"master"``: accumulated in an FP32 master and rounded only for use (lesson 04);
- ``"kahan"``: a 16-bit weight plus a 16-bit compensation (`mpcourse.kahan`);
- ``"stochastic"``: stochastic rounding (`mpcourse.stochastic`): right on average.

It runs `n` independent weights at once, so that the stochastic walk's mean and spread can be
measured; the deterministic cures give `n` identical walks.
"""
from __future__ import annotations

import math

import torch

from mpcourse.formats import BF16, FloatFormat, round_to
from mpcourse.kahan import compensated_add

CURES = ("nearest", "master", "kahan", "stochastic")


def walk(start: float, update: float, steps: int, cure: str, n: int = 1,
         generator: torch.Generator | None = None, record_every: int = 1) -> torch.Tensor:
    """The stored weights (float64, shape [steps // record_every + 1, n]) of `steps` additions of
    `update` to BF16 weights that start at `start`, kept by `cure`."""
    if cure not in CURES:
        raise ValueError(f"unknown cure {cure!r}; choose one of {', '.join(CURES)}")
    if steps < 1 or n < 1 or record_every < 1:
        raise ValueError(f"steps, n and record_every must be at least 1, got {steps}, {n}, "
                         f"{record_every}")
    weight = torch.full((n,), start).bfloat16()
    exact = weight.float()                      # the FP32 master, for "master"
    compensation = torch.zeros_like(weight)     # for "kahan"
    step_update = torch.full((n,), update)
    trace = [weight.double()]
    for step in range(1, steps + 1):
        if cure == "nearest":
            weight = (weight.float() + step_update).bfloat16()
        elif cure == "master":
            exact = exact + step_update
            weight = exact.bfloat16()
        elif cure == "kahan":
            weight, compensation = compensated_add(weight, compensation, step_update)
        else:
            weight = round_to(weight.float() + step_update, BF16, rounding="stochastic",
                              generator=generator).bfloat16()
        if step % record_every == 0:
            trace.append(weight.double())
    return torch.stack(trace)


def stochastic_spread(start: float, update: float, steps: int, fmt: FloatFormat = BF16) -> float:
    """The standard deviation of a stochastically rounded weight after `steps` updates.

    While the walk stays in one binade, whose gap is g, each step moves the stored weight by a
    whole gap with probability p = update / g, independently: the sum of `steps` such moves has
    variance steps * p * (1 - p) * g**2.
    """
    gap = 2.0 ** (math.floor(math.log2(abs(start))) - fmt.mantissa_bits)
    p = abs(update) / gap
    if not 0 <= p <= 1:
        raise ValueError(f"update {update} is larger than the gap {gap} at {start}")
    return gap * math.sqrt(steps * p * (1 - p))
