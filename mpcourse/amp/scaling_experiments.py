"""Experiments of lesson 05: the dynamic scaler's reaction to overflows, and two that lesson
09's clinic stages again, written once for both.

- `scale_trace`: the scale `mpcourse.amp.scaling.GradScaler` uses in each iteration of a tiny run
  whose gradients are made infinite on purpose, for lesson 05's picture of the scaler.
- `clipped_step`: one loss-scaled step with gradient clipping, with `unscale_` before the clip
  (right) or after it (the mistake: the threshold is divided by the scale), or with no scaler at
  all (the FP32 reference).
- `resume_experiment`: train without a break; train, checkpoint and resume with the scaler's
  state; resume without it (the mistake: the scale restarts at its initial value and skips steps
  to find its level again).

The last two take the model, optimizer and training step from their caller, so the lesson runs
them on its small FP32 model under autocast to FP16 and the clinic on its own small models; both
work as well for 16-bit parameters with FP32 masters (pass the masters as `params`).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import nn

from mpcourse.amp.scale_update import checked_scale
from mpcourse.amp.scaling import GradScaler


def skipped_steps(scales: list[float], initial_scale: float = 2.0**16) -> list[int]:
    """The positions in `scales` (the scale after each update) where the scale went down.

    A dynamic scaler lowers its scale exactly when it skipped the step for an inf or NaN, so
    these are the skipped steps. `initial_scale` is the scale before the first of them.
    """
    for scale in [initial_scale, *scales]:
        checked_scale(scale, "each scale", reached=True)
    return [i for i, s in enumerate(scales) if s < ([initial_scale] + scales)[i]]


@dataclass(frozen=True)
class ScaleTrace:
    """The scale a dynamic scaler used in each iteration of a run that overflowed on purpose."""
    scales: list[float]               # the scale of each iteration, before its update
    overflow_steps: tuple[int, ...]   # the iterations whose gradients were made infinite
    init_scale: float
    growth_interval: int


def scale_trace(steps: int = 40, overflow_steps: tuple[int, ...] = (6, 25),
                init_scale: float = 2.0**10, growth_interval: int = 5) -> ScaleTrace:
    """The scale `mpcourse.amp.scaling.GradScaler` used in each of `steps` iterations of a tiny
    SGD run whose gradient is made infinite at `overflow_steps` (counted from 0)."""
    bad = [s for s in overflow_steps if not 0 <= s < steps]
    if bad:
        raise ValueError(f"overflow_steps must lie in [0, {steps}), got {bad}")
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=1e-3)
    scaler = GradScaler(init_scale=init_scale, growth_interval=growth_interval)
    scales = []
    for step in range(steps):
        optimizer.zero_grad()
        scaler.scale((weight + 1.0).sum()).backward()
        if step in overflow_steps:
            weight.grad.fill_(float("inf"))
        scales.append(scaler.get_scale())
        scaler.step(optimizer)
        scaler.update()
    return ScaleTrace(scales, tuple(overflow_steps), init_scale, growth_interval)


@dataclass(frozen=True)
class ClippedStep:
    """The gradient norms of one clipped step."""
    true_norm: float     # the unscaled gradient's norm before clipping
    applied_norm: float  # the norm of the gradient the optimizer stepped with


def clipped_step(loss: torch.Tensor, optimizer: Any, params: Iterable[torch.Tensor],
                 max_norm: float, scaler: Any = None, unscale_first: bool = True) -> ClippedStep:
    """Backward `loss`, clip the gradients of `params` to `max_norm`, step; report both norms.

    `params` are the tensors whose gradients `optimizer` applies (the FP32 masters, under
    `MasterWeightOptimizer`). With a `scaler`, `unscale_first=False` clips the still-scaled
    gradients, and `scaler.step` unscales them afterwards; `scaler=None` is the unscaled
    reference.
    """
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not 0 < max_norm < math.inf:
        raise ValueError(f"max_norm must be a positive finite number, got {max_norm!r}")
    params = list(params)
    if scaler is None:
        loss.backward()
        scale = 1.0
    else:
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
    true_norm = nn.utils.get_total_norm([p.grad / scale for p in params]).item()
    if scaler is not None and unscale_first:
        scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(params, max_norm)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)  # unscales here if unscale_ was not called
        scaler.update()
    return ClippedStep(true_norm, nn.utils.get_total_norm([p.grad for p in params]).item())


@dataclass(frozen=True)
class Run:
    """One training run of `resume_experiment`: the scale after each of its steps, and its model."""
    scales: list[float]
    model: nn.Module


@dataclass(frozen=True)
class ResumeExperiment:
    """An uninterrupted run, and the same run stopped at a checkpoint and resumed two ways."""
    checkpoint: dict[str, Any]  # "model", "optimizer", "scaler": their state_dicts at the stop
    uninterrupted: Run          # every step
    with_scaler_state: Run      # the steps after the stop, the scaler's state restored
    without_scaler_state: Run   # the same steps, with a fresh scaler


Start = Callable[[], tuple[nn.Module, Any, Any]]
Train = Callable[[nn.Module, Any, Any, range], list[float]]


def resume_experiment(start: Start, train: Train, steps: int, stop_at: int) -> ResumeExperiment:
    """Run `steps` steps, and the same run checkpointed after `stop_at` and resumed twice.

    `start()` builds a fresh (model, optimizer, scaler); `train(model, optimizer, scaler,
    range(a, b))` trains steps a to b-1 (each step must depend only on its index and the run's
    state, so a resumed run can repeat the uninterrupted one) and returns the scale after each.
    The optimizer is restored from a copy of its state, since torch's optimizers may keep the
    very tensors they load.
    """
    if not 0 < stop_at < steps:
        raise ValueError(f"stop_at must lie between 0 and steps={steps} (exclusive), got {stop_at}")
    model, optimizer, scaler = start()
    uninterrupted = Run(train(model, optimizer, scaler, range(steps)), model)
    model, optimizer, scaler = start()
    train(model, optimizer, scaler, range(stop_at))
    checkpoint = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "scaler": scaler.state_dict()})

    def resumed(with_scaler_state: bool) -> Run:
        model, optimizer, scaler = start()
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))
        if with_scaler_state:
            scaler.load_state_dict(checkpoint["scaler"])
        return Run(train(model, optimizer, scaler, range(stop_at, steps)), model)

    return ResumeExperiment(checkpoint, uninterrupted, resumed(True), resumed(False))
