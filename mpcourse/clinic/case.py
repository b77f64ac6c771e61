"""The clinic's record of one case, and the pieces every reproduction is built from.

A case function makes the mistake on a tiny model, measures the symptom, applies the fix and
measures again; what it returns is a `Case`. The pieces here are the ones the cases share: a
seeded block, seeded regression data, a small MLP, and one loss-scaled step that says whether
the scaler skipped it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Case:
    """One clinic case: what the learner sees, why, the fix, and the numbers measured for both."""
    number: int
    title: str
    symptom: str
    cause: str
    fix: str
    references: tuple[str, ...]
    before: dict[str, Any]  # measured with the mistake in place
    after: dict[str, Any]   # measured with the fix applied
    evidence: str           # one line built from `before` and `after`

    def __str__(self) -> str:
        lines = [f"Case {self.number}: {self.title}", f"  symptom : {self.symptom}",
                 f"  cause   : {self.cause}", f"  fix     : {self.fix}",
                 f"  measured: {self.evidence}"]
        return "\n".join(lines)


@contextlib.contextmanager
def seeded(seed: int):
    """Seed torch's global generator for the block, then restore whatever state it had."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def regression_data(n_in: int, n_out: int, batch: int, seed: int,
                    target_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs (batch, n_in) and targets (batch, n_out) times `target_scale`, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n_in, generator=g)
    y = target_scale * torch.randn(batch, n_out, generator=g)
    return x, y


def tiny_mlp(dtype: torch.dtype = torch.float32, seed: int = 4) -> nn.Module:
    """Linear(8, 16) -> Tanh -> Linear(16, 4), initialised from `seed`, in `dtype`."""
    with seeded(seed):
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(dtype)


def scaled_step(scaler: Any, optimizer: Any, loss: torch.Tensor) -> bool:
    """Backward `loss` through `scaler`, step and update; True when the scaler skipped the step.

    A dynamic scaler lowers its scale exactly when it skipped the step for an inf or NaN.
    """
    scaler.scale(loss).backward()
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() < before
