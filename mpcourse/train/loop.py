"""The one training loop: `build` a run from its config, then `train` it, step by step."""
from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from mpcourse.amp.autocast_mode import autocast as mpcourse_autocast
from mpcourse.machine.benchmark import synchronize
from mpcourse.train.data import Batches, MarkovText
from mpcourse.amp.master import MasterWeightOptimizer
from mpcourse.memory.measure import measure_peak_memory
from mpcourse.train.models import GPT, next_token_loss
from mpcourse.numbers.precision import autocast_dtype
from mpcourse.amp.scaling import GradScaler, StaticLossScaler
from mpcourse.train.checkpoint import load_checkpoint, save_checkpoint
from mpcourse.train.config import RunConfig
from mpcourse.train.device import precision_support
from mpcourse.train.result import Callback, RunResult, StepInfo


@dataclass
class Setup:
    """What a run trains on and with, made by `build`."""
    text: MarkovText              # the data's source; its entropy rate is the best loss possible
    batches: Batches              # training batches, one per step
    eval_batches: Batches         # held-out batches
    model: torch.nn.Module
    optimizer: object
    parameters: list              # whose gradients are clipped (FP32 masters with master weights)
    scaler: object                # torch's or the course's loss scaler (disabled without scaling)


def build(config: RunConfig, device: torch.device) -> Setup:
    """Seed every generator, then make the run's data, model, optimizer and loss scaler."""
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    text = MarkovText(config.vocab_size, seed=config.seed)
    batches = Batches(text, config.batch_size, config.seq_len, seed=config.seed, device=device)
    eval_batches = Batches(text, config.batch_size, config.seq_len, seed=config.seed + 1,
                           device=device)
    model = config.prepare_model(GPT(config.model_config()).to(device))
    optimizer, parameters = config.make_optimizer(model)
    return Setup(text, batches, eval_batches, model, optimizer, parameters,
                 _scaler(config, device.type))


def train(config: RunConfig, callbacks: Iterable[Callback] = (), *,
          checkpoint_path: str | Path | None = None, resume: bool = False) -> RunResult:
    """Train the lesson's GPT with `config`, calling each callback after every step.

    One iteration is the recipe of lessons 03 to 05, in this order::

        with autocast(device, dtype):           # forward and loss in 16 bits where it is safe
            loss = next_token_loss(model(x), y)
        scaler.scale(loss).backward()           # backward outside autocast, on the scaled loss
        scaler.unscale_(optimizer)              # true gradients, so that clipping sees them
        clip_grad_norm_(params, grad_clip)
        scaler.step(optimizer)                  # skipped if a gradient overflowed
        scaler.update()                         # choose the next scale

    Timing is honest: warm-up steps are excluded, and the host waits for the device once per
    step, at its end (and once before the first), so no step is charged for another's queued
    work. With `checkpoint_path`, the run saves a checkpoint there when it ends, and also
    when it is interrupted (Ctrl-C, i.e. KeyboardInterrupt, which is then re-raised). With
    `resume=True` it continues from that checkpoint: the continued run's losses equal, bit for
    bit on the CPU, those of a run that was never interrupted.
    """
    device = config.resolved_device()
    support = precision_support(config.precision, device.type)
    callbacks = list(callbacks)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run = build(config, device)
    result = RunResult(config, device.type, config.accelerated(device, support),
                       floor=run.text.entropy_rate)
    start_step = 0
    if resume:
        start_step = load_checkpoint(checkpoint_path, config, run.model, run.optimizer, run.scaler,
                                     result)

    try:
        with _matmul_precision(config.precision, device.type):
            _run_steps(run, config, result, device, start_step, callbacks)
            result.eval_loss = _evaluate(run.model, run.eval_batches, config, device.type)
    except KeyboardInterrupt:
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path, run.model, run.optimizer, run.scaler, result)
        raise
    if device.type == "cuda":
        result.peak_memory_bytes = torch.cuda.max_memory_allocated(device)
        result.memory_measured_by = "CUDA caching allocator: peak over the run"
    if checkpoint_path is not None:
        save_checkpoint(checkpoint_path, run.model, run.optimizer, run.scaler, result)
    return result


def _run_steps(run: Setup, config: RunConfig, result: RunResult, device: torch.device, start_step: int,
               callbacks: list[Callback]) -> None:
    """Steps `start_step` to the end (or the time limit), each timed, recorded and told to the
    callbacks."""
    # Memory is measured on the run's second step: the first with the optimizer's state, as in
    # every later step (the first step creates Adam's moments only at its very end).
    measured_step = min(start_step + 1, config.steps - 1)
    synchronize(device)  # the first step's clock starts on an idle device, as every later one's
    started = time.perf_counter()
    for step in range(start_step, config.steps):
        scale = run.scaler.get_scale() if run.scaler.is_enabled() else 1.0
        loss, grad_norm, seconds = _timed_step(run, step, config, result, device,
                                               measure_memory=step == measured_step)
        info = StepInfo(step, config.steps, config.reported_loss(loss), seconds,
                        config.batch_size * config.seq_len / seconds, scale,
                        skipped=run.scaler.is_enabled() and not math.isfinite(grad_norm))
        _record(result, info, timed=step >= start_step + config.warmup_steps)
        for callback in callbacks:
            callback(info)
        if _out_of_time(config, started) and step + 1 < config.steps:
            result.stopped_early = True
            return


def compare(configs: Iterable[RunConfig], callbacks: Iterable[Callback] = ()) -> list[RunResult]:
    """Run each configuration in turn, on the same data; the results in the same order, for
    `mpcourse.views.runs.RunComparison` to show side by side."""
    callbacks = list(callbacks)
    return [train(config, callbacks) for config in configs]


def _timed_step(run: Setup, step: int, config: RunConfig, result: RunResult,
                device: torch.device, measure_memory: bool) -> tuple[torch.Tensor, float, float]:
    """One iteration of `_train_step`: its loss, its gradient norm and its seconds.

    The clock stops after one wait for the device, at the step's end: the previous step ended the
    same way, so the device is idle when the clock starts. The gradient norm is read only then,
    so reading it costs no second wait. On a CPU, the step chosen by `measure_memory` also records
    the step's peak memory, which only a watched step can see.
    """
    outcome = []
    begin = time.perf_counter()
    if measure_memory and device.type != "cuda" and config.cpu_memory_accounting:
        peak = measure_peak_memory(lambda: outcome.append(_train_step(run, step, config, result)),
                                   model=run.model, optimizer=run.optimizer, device=device)
        _record_cpu_memory(result, peak, run.model, run.optimizer)
    else:
        outcome.append(_train_step(run, step, config, result))
    synchronize(device)
    seconds = time.perf_counter() - begin
    (loss, grad_norm), = outcome
    return loss, grad_norm.item(), seconds


def _out_of_time(config: RunConfig, started: float) -> bool:
    """Whether the run has used up its `time_limit_s` (never, without one)."""
    return config.time_limit_s is not None and time.perf_counter() - started > config.time_limit_s


def _train_step(run: Setup, step: int, config: RunConfig, result: RunResult):
    """One iteration of the recipe; returns the loss and the unscaled gradient norm (tensors).

    The loss is computed in FP32 from whatever dtype the logits have: under autocast the
    cross-entropy runs in FP32 anyway, and a model whose parameters are 16 bits without
    autocast (FSDP2's `param_dtype`) gets the same treatment.
    """
    x, y = config.local_batch(*run.batches.get(step))
    scaler = run.scaler
    with config.measuring(step, run.model, result.measurements):
        with _autocast(config, x.device.type):
            loss = next_token_loss(run.model(x).float(), y)
        scaler.scale(loss).backward()
    scaler.unscale_(run.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.parameters, config.grad_clip or math.inf)
    scaler.step(run.optimizer)
    if config.loss_scaling == "static" and isinstance(scaler, torch.amp.GradScaler):
        scaler.update(new_scale=config.static_scale)  # torch has no static scaler: pin the scale
    else:
        scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm


def _autocast(config: RunConfig, device_type: str):
    if not config.low_precision:
        return contextlib.nullcontext()
    implementation = torch.autocast if config.autocast == "torch" else mpcourse_autocast
    return implementation(device_type, dtype=autocast_dtype(config.precision))


@contextlib.contextmanager
def _matmul_precision(precision: str, device_type: str):
    """TF32 matmuls on CUDA for "tf32" only; every other run gets true FP32 matmuls."""
    if device_type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _scaler(config: RunConfig, device_type: str):
    enabled = config.loss_scaling != "off"
    if config.autocast == "torch":
        init_scale = config.static_scale if config.loss_scaling == "static" else config.init_scale
        return torch.amp.GradScaler(device_type, init_scale=init_scale,
                                    growth_interval=config.growth_interval, enabled=enabled)
    if config.loss_scaling == "static":
        return StaticLossScaler(config.static_scale)
    return GradScaler(config.init_scale, growth_interval=config.growth_interval, enabled=enabled)


def _record(result: RunResult, info: StepInfo, timed: bool) -> None:
    result.losses.append(info.loss)
    result.step_seconds.append(info.seconds)
    result.timed.append(timed)
    result.scales.append(info.scale)
    if info.skipped:
        result.skipped_steps.append(info.step)


def _record_cpu_memory(result: RunResult, peak, model: GPT, optimizer) -> None:
    """The CPU has no allocator counter: add up what the step held at its peak.

    `peak` is the moment the parameters, their gradients, the optimizer state and the tensors
    saved for backward added up to the most; the FP32 masters and their gradients, which the
    optimizer keeps outside the model, are added here.
    """
    masters = optimizer.master_parameters() if isinstance(optimizer, MasterWeightOptimizer) else []
    result.peak_memory_bytes = peak.peak + sum(2 * m.nbytes for m in masters)
    result.memory_measured_by = ("tensor accounting on the second step: the moment parameters, "
                                 "gradients, optimizer state and saved tensors added up to the "
                                 "most, plus the FP32 masters and their gradients")


@torch.no_grad()
def _evaluate(model: GPT, batches: Batches, config: RunConfig, device_type: str) -> float:
    """Mean loss on held-out batches, computed the way the run computes its forward pass."""
    losses = []
    for i in range(config.eval_batches):
        x, y = batches.get(i)
        with _autocast(config, device_type):
            losses.append(next_token_loss(model(x).float(), y).item())
    return sum(losses) / len(losses)
