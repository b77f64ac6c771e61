"""One weight, many small updates: what each cure for vanishing updates keeps (lessons 04, 11).

`walk` adds the same update to a 16-bit weight step after step and records the weight, the way
an optimizer would with a constant gradient. The cures differ only in how each sum is stored:

- ``"nearest"``: rounded to nearest in the format: an update below half the gap is lost;
- ``"master"``: accumulated in an FP32 master and rounded only for use (lesson 04);
- ``"kahan"``: a 16-bit weight plus a 16-bit compensation (`mpcourse.optim.kahan`);
- ``"stochastic"``: stochastic rounding (`mpcourse.optim.stochastic`): right on average.

It runs `n` independent weights at once, so that the stochastic walk's mean and spread can be
measured; the deterministic cures give `n` identical walks. `master_walk` keeps the three
walks of lesson 04's picture together: the FP32 master, its BF16 copy, and a BF16 weight alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mpcourse.numbers.float_format import BF16, FloatFormat, as_format
from mpcourse.numbers.rounding import round_to
from mpcourse.optim.kahan import compensated_add

CURES = ("nearest", "master", "kahan", "stochastic")


def walk(start: float, update: float, steps: int, cure: str, n: int = 1,
         generator: torch.Generator | None = None, record_every: int = 1) -> torch.Tensor:
    """The stored weights (float64, shape [steps // record_every + 1, n]) of `steps` additions of
    `update` to BF16 weights that start at `start`, kept by `cure`."""
    if cure not in CURES:
        raise ValueError(f"unknown cure {cure!r}; choose one of {', '.join(CURES)}")
    _check_walk(start, update, steps)
    for name, count in (("n", n), ("record_every", record_every)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{name} must be an integer of at least 1, got {count!r}")
    return _walks(start, update, steps, cure, n, generator, record_every)[0]


def _check_walk(start: float, update: float, steps: int) -> None:
    """Refuse a walk that cannot be taken: a start or update that is no finite number, or a
    number of steps that is no positive integer."""
    for name, value in (("start", start), ("update", update)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer of at least 1, got {steps!r}")


def _walks(start: float, update: float, steps: int, cure: str, n: int,
           generator: torch.Generator | None,
           record_every: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`walk`'s stored weights, and the FP32 masters beside them (used by "master" only)."""
    weight = torch.full((n,), start).bfloat16()
    exact = weight.float()                      # the FP32 master, for "master"
    compensation = torch.zeros_like(weight)     # for "kahan"
    step_update = torch.full((n,), update)
    trace, masters = [weight.double()], [exact.double()]
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
            masters.append(exact.double())
    return torch.stack(trace), torch.stack(masters)


@dataclass(frozen=True)
class MasterWalk:
    """`steps` updates of `update` to a weight that starts at `start`, kept two ways; each
    tensor (float64) holds the weight before the first update and after each one."""
    start: float
    update: float
    steps: int
    master: torch.Tensor    # the FP32 master
    working: torch.Tensor   # its BF16 working copy: the master rounded to nearest
    alone: torch.Tensor     # a BF16 weight updated by itself ("nearest")


def master_walk(start: float, update: float, steps: int) -> MasterWalk:
    """A BF16 weight under `steps` small updates, kept as an FP32 master and kept alone."""
    _check_walk(start, update, steps)
    alone = walk(start, update, steps, "nearest")[:, 0]
    working, master = _walks(start, update, steps, "master", 1, None, 1)
    return MasterWalk(start, update, steps, master=master[:, 0], working=working[:, 0],
                      alone=alone)


def stochastic_spread(start: float, update: float, steps: int, fmt: FloatFormat = BF16) -> float:
    """The standard deviation of a stochastically rounded weight after `steps` updates.

    While the walk stays in one binade, whose gap is g, each step moves the stored weight by a
    whole gap with probability p = update / g, independently: the sum of `steps` such moves has
    variance steps * p * (1 - p) * g**2.
    """
    _check_walk(start, update, steps)
    fmt = as_format(fmt)
    if start == 0:
        raise ValueError(f"start must be nonzero, got {start!r}: the gap around 0 is no binade's")
    gap = 2.0 ** (math.floor(math.log2(abs(start))) - fmt.mantissa_bits)
    p = abs(update) / gap
    if not 0 <= p <= 1:
        raise ValueError(f"update {update} is larger than the gap {gap} at {start}")
    return gap * math.sqrt(steps * p * (1 - p))
