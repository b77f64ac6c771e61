"""Measure a rung of the ladder: the bytes a training step keeps, and the peak of its `step()`.

`measure_rung(config)` builds the run as the training loop does (`train.build`), takes one whole
step so that the optimizer's state exists, then a forward and backward, and measures the
optimizer's second step, the first that looks like every later one:

- `kept`: the bytes of each role between steps, counted from the tensors themselves (weights,
  gradients, FP32 masters, compensation, moments with their scales and step counters);
- `step`: every tensor byte alive during `optimizer.step()`, op by op (`step_memory`), with the
  gradients still in place: the peak, which includes the step's FP32 temporaries.

Trained rungs are compared over seeds: `seed_interval(gaps)` takes one rung's final loss minus
FP32's, one value per seed (the same seed: the same data and initial weights), and estimates
the seed-to-seed spread from them, with the 95% confidence interval of their mean.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from mpcourse.train.models import next_token_loss
from mpcourse.train.variants.ladder import LadderRunConfig
from mpcourse.memory.step_peak import LivePeak, held_tensors, measure_live_peak
from mpcourse.train.loop import build


@dataclass(frozen=True)
class RungMemory:
    parameters: int
    sizes: tuple[int, ...]
    kept: dict[str, int]
    step: LivePeak

    @property
    def kept_per_parameter(self) -> float:
        return sum(self.kept.values()) / self.parameters

    @property
    def peak_per_parameter(self) -> float:
        return self.step.peak / self.parameters


def kept_bytes(model: torch.nn.Module, optimizer) -> dict[str, int]:
    """Bytes held between steps by role, each storage counted once."""
    params = list(model.parameters())
    roles = {"weights": [*params], "gradients": [p.grad for p in params if p.grad is not None],
             "masters": [], "compensation": [], "moments": []}
    for state in optimizer.state.values():
        for name, tensor in state.items():
            if not isinstance(tensor, torch.Tensor):
                continue
            role = {"master": "masters", "compensation": "compensation"}.get(name, "moments")
            roles[role].append(tensor)
            if tensor.grad is not None:
                roles["gradients"].append(tensor.grad)
    seen: set[int] = set()
    counted = {}
    for role, tensors in roles.items():
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        counted[role] = sum(size for key, size in storages.items() if key not in seen)
        seen.update(storages)
    return counted


def measure_rung(config: LadderRunConfig, per_tensor: bool | None = None) -> RungMemory:
    """The bytes one rung keeps and the peak of its optimizer's step (`per_tensor` overrides the
    config's), on the CPU."""
    if per_tensor is not None:
        config = replace(config, per_tensor=per_tensor)
    run = build(config, torch.device("cpu"))
    for step in range(2):
        x, y = run.batches.get(step)
        next_token_loss(run.model(x).float(), y).backward()
        torch.nn.utils.clip_grad_norm_(run.parameters, config.grad_clip or math.inf)
        if step == 0:
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
    kept = kept_bytes(run.model, run.optimizer)
    peak = measure_live_peak(run.optimizer.step, lambda: held_tensors(run.model, run.optimizer))
    sizes = tuple(p.numel() for p in run.model.parameters())
    return RungMemory(sum(sizes), sizes, kept, peak)


#: Student's t distribution's 97.5% quantile for 1 to 10 degrees of freedom: a two-sided 95%
#: interval for the mean of 2 to 11 values whose spread is estimated from the values themselves.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


@dataclass(frozen=True)
class SeedInterval:
    """The mean of one value per seed, the seeds' spread (sample standard deviation) and the 95%
    confidence interval of the mean, mean +- t * spread / sqrt(seeds)."""
    mean: float
    spread: float
    low: float
    high: float
    seeds: int


def seed_interval(values: Sequence[float]) -> SeedInterval:
    """Mean, spread and 95% interval of `values` (one per seed, 2 to 11 of them). The spread
    comes from the values: with few seeds it is itself uncertain, which Student's t widens the
    interval for (by 3.18 standard errors with 4 seeds, against 1.96 were the spread known)."""
    values = [float(v) for v in values]
    if not 2 <= len(values) <= len(T_975) + 1:
        raise ValueError(f"seed_interval needs 2 to {len(T_975) + 1} values, one per seed; "
                         f"got {len(values)}")
    mean, spread = statistics.fmean(values), statistics.stdev(values)
    half = T_975[len(values) - 2] * spread / math.sqrt(len(values))
    return SeedInterval(mean, spread, mean - half, mean + half, len(values))
