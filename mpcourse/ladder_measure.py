"""Measure a rung of the ladder: the bytes a training step keeps, and the peak of its `step()`.

`measure_rung(config)` builds the run as the training loop does (`train.build`), takes one whole
step so that the optimizer's state exists, then a forward and backward, and measures the
optimizer's second step, the first that looks like every later one:

- `kept`: the bytes of each role between steps, counted from the tensors themselves (weights,
  gradients, FP32 masters, compensation, moments with their scales and step counters);
- `step`: every tensor byte alive during `optimizer.step()`, op by op (`step_memory`), with the
  gradients still in place: the peak, which includes the step's FP32 temporaries.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from mpcourse.models import next_token_loss
from mpcourse.optimizer_memory import LadderRunConfig
from mpcourse.step_memory import LivePeak, held_tensors, measure_live_peak
from mpcourse.train import build


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
