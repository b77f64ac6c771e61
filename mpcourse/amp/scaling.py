"""Loss scaling: keep small FP16 gradients from flushing to zero (lesson 05).

FP16 cannot hold a magnitude below 2**-24; many gradients of a real network are smaller than
that and would become exactly zero. Multiplying the loss by a large factor S multiplies every
gradient by S (the chain rule is linear), which lifts them into FP16's range. Before the
optimizer uses them, the gradients are divided by S again, in FP32.

`GradScaler` is a readable re-implementation of `torch.amp.GradScaler`: same methods, same
arguments, same decisions and the same bits (the tests run both side by side). `StaticLossScaler`
is the older, simpler scheme with a scale that never changes.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Iterable

import torch

from mpcourse.amp.optimizer_grads import OptimizerState, Stage, any_non_finite, grads_of
from mpcourse.amp.scale_update import (checked_backoff_factor, checked_growth_factor,
                                       checked_growth_interval, checked_growth_tracker,
                                       checked_new_scale, checked_scale, required_keys, to_fp32,
                                       update_scale)

__all__ = ["GradScaler", "StaticLossScaler", "update_scale", "to_fp32"]


class GradScaler:
    """Dynamic loss scaling with the API and the exact behaviour of `torch.amp.GradScaler`.

    One training iteration uses it like this::

        scaler.scale(loss).backward()    # gradients come out multiplied by the scale S
        scaler.unscale_(optimizer)       # optional: divide them by S now, e.g. to clip them
        scaler.step(optimizer)           # unscale if not done yet; step only if all are finite
        scaler.update()                  # choose the scale for the next iteration

    The best scale is the largest one that does not overflow: large lifts small gradients out of
    FP16's underflow zone, too large turns big ones into inf. Nobody knows it in advance, so the
    scaler searches for it while training:

    - `unscale_` multiplies every gradient of the optimizer by 1/S (computed in FP64, rounded to
      FP32) and records whether any gradient held an inf or a NaN *before* that multiplication.
    - `step` skips `optimizer.step()` for an optimizer whose gradients were not all finite, so a
      bad iteration never reaches the weights or the optimizer's state.
    - `update` multiplies S by `backoff_factor` (default 0.5) if any optimizer saw an inf or NaN
      this iteration; after `growth_interval` (default 2000) clean iterations in a row it
      multiplies S by `growth_factor` (default 2). See `update_scale`.

    So the scale drops quickly when it is too high and probes upward slowly, costing one skipped
    step each time it overshoots. The scale lives as an FP32 number and is created at the first
    `scale()` call, like torch's.

    An optimizer that unscales inside its own step (`_step_supports_amp_scaling`, e.g. torch's
    `fused=True` Adam, AdamW, SGD and Adagrad) is not unscaled here: as torch does, `step` checks
    its gradients for inf/NaN, hands it the scale and the verdict as `optimizer.grad_scale` and
    `optimizer.found_inf` (or itself as `grad_scaler=`, if its `step` takes that argument) and
    lets it skip or unscale. Such an optimizer may own FP16 gradients.

    Misuse raises what torch raises: AssertionError for a call before `scale()` and for `step` or
    `update` with no gradient to check, RuntimeError for a repeated `unscale_` or `step`.

    Differences from torch, none of which changes a decision or a bit of the results of a valid
    program: there is no `device` argument (the scale goes to whatever device the loss is on);
    the inf/NaN flag is a Python bool per optimizer rather than a tensor per device (reading it
    costs a host sync, which torch delays until `step`); `update(new_scale)` refuses an infinite,
    NaN, zero or negative scale (ValueError) where torch takes it; and bad constructor or setter
    arguments raise ValueError where torch raises AssertionError or accepts them.

    A warning is raised when overflows drive the scale below 1: then the gradients overflow even
    unscaled, which almost always means the loss or the forward pass itself produced inf or NaN,
    and no scale can fix that.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        if isinstance(init_scale, str):
            raise ValueError(f"init_scale must be a positive number, got {init_scale!r} "
                             "(mpcourse's GradScaler takes no device argument: the scale "
                             "follows the loss)")
        self._enabled = enabled
        self._init_scale = checked_scale(init_scale, "init_scale")
        self._scale: float | None = None  # set by the first scale(), rounded to FP32
        self._growth_tracker = 0
        self.set_growth_factor(growth_factor)
        self.set_backoff_factor(backoff_factor)
        self.set_growth_interval(growth_interval)
        self._per_optimizer: dict[int, OptimizerState] = {}

    # The four calls of an iteration, in the order they are made.

    def scale(self, outputs: torch.Tensor | Iterable) -> torch.Tensor | Iterable:
        """`outputs` (a tensor, or nested lists/tuples of tensors) multiplied by the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._scale = to_fp32(self._init_scale)
            return outputs * torch.tensor(self._scale, dtype=torch.float32, device=outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if isinstance(outputs, Iterable):
            return map(self.scale, outputs)
        raise ValueError(f"outputs must be a Tensor or an iterable of Tensors, got {type(outputs)}")

    def unscale_(self, optimizer) -> None:
        """Divide the optimizer's gradients by the scale, in place, and note any inf or NaN.

        Call it explicitly only when you need the true gradients before `step`, e.g. to clip
        them; at most once per optimizer per iteration, after all gradients are accumulated.
        """
        if not self._enabled:
            return
        self._require_scale("unscale_")
        state = self._state(optimizer)
        if state.stage is Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update().")
        if state.stage is Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        grads = grads_of(optimizer)
        if any(g.dtype == torch.float16 for g in grads):
            raise ValueError("Attempting to unscale FP16 gradients.")
        inv_scale = torch.tensor(self._scale, dtype=torch.float64).reciprocal().float()
        state.found_inf = any_non_finite(grads)
        with torch.no_grad():
            for grad in grads:
                grad.mul_(inv_scale.to(grad.device))
        state.stage = Stage.UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """Unscale (unless `unscale_` already did), then `optimizer.step()` only if all finite.

        Returns what `optimizer.step` returns, or None when the step was skipped.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._require_scale("step")
        state = self._state(optimizer)
        if state.stage is Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._step_unscaling_inside(optimizer, state, args, kwargs)
        if state.stage is Stage.READY:
            self.unscale_(optimizer)
        if state.found_inf is None:
            raise AssertionError("No inf checks were recorded for this optimizer: none of its "
                                 "parameters has a gradient.")
        result = None if state.found_inf else optimizer.step(*args, **kwargs)
        state.stage = Stage.STEPPED
        return result

    def _step_unscaling_inside(self, optimizer, state: OptimizerState, args, kwargs):
        """Step an optimizer that unscales in its own kernel and skips itself on inf/NaN.

        It receives the scale still to divide by (None if `unscale_` already did) and whether
        any gradient is inf or NaN; checking needs no division, so FP16 gradients are fine.
        """
        if "grad_scaler" in inspect.signature(optimizer.step).parameters:
            warnings.warn(  # torch's words: this older form of the protocol is on its way out
                "GradScaler is going to stop passing itself as a keyword argument to the passed "
                "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                "`found_inf: Tensor` to the passed optimizer and let the optimizer use them "
                "directly.", FutureWarning, stacklevel=3)
            result = optimizer.step(*args, **kwargs, grad_scaler=self)
            state.stage = Stage.STEPPED
            return result
        grads = grads_of(optimizer)
        device = grads[0].device if grads else torch.device("cpu")
        if state.stage is Stage.READY:
            state.found_inf = any_non_finite(grads)
        scale = torch.tensor(self._scale, dtype=torch.float32, device=device)
        optimizer.grad_scale = getattr(optimizer, "grad_scale", None) \
            if state.stage is Stage.UNSCALED else scale * getattr(optimizer, "grad_scale", 1)
        optimizer.found_inf = torch.tensor(float(bool(state.found_inf)), device=device)
        try:
            result = optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale, optimizer.found_inf
        state.stage = Stage.STEPPED
        return result

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Pick the next iteration's scale (see `update_scale`), or set it to `new_scale`.

        `new_scale` is a float or a 0-d tensor without grad, as torch requires; see
        `_checked_new_scale` for the errors anything else gets.
        """
        if not self._enabled:
            return
        self._require_scale("update")
        if new_scale is not None:
            self._scale = checked_new_scale(new_scale)
        else:
            checks = [state.found_inf for state in self._per_optimizer.values()
                      if state.found_inf is not None]
            if not checks:
                raise AssertionError("No inf checks were recorded prior to update(): call step() "
                                     "(or unscale_()) for each optimizer first.")
            found_inf = any(checks)
            before = self._scale
            self._scale, self._growth_tracker = update_scale(
                self._scale, self._growth_tracker, found_inf, self._growth_factor,
                self._backoff_factor, self._growth_interval)
            if found_inf and self._scale < 1.0 <= before:
                warnings.warn(
                    f"GradScaler: overflows have pushed the loss scale down to {self._scale:g}, "
                    "below 1, so the gradients are inf or NaN even unscaled. The loss or the "
                    "forward pass itself is probably not finite; lowering the scale cannot fix "
                    "that.", RuntimeWarning, stacklevel=2)
        self._per_optimizer = {}

    # Getters and setters, as in torch.

    def get_scale(self) -> float:
        """The current scale (`init_scale` before the first `scale()`), or 1.0 if disabled."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = checked_growth_factor(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = checked_backoff_factor(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = checked_growth_interval(new_interval)

    def is_enabled(self) -> bool:
        return self._enabled

    # Checkpointing: without these, a resumed run restarts its search from init_scale.

    def state_dict(self) -> dict[str, Any]:
        """Scale, factors, interval and growth tracker (torch's keys); {} if disabled."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (ours or torch's); a no-op if disabled."""
        if not self._enabled:
            return
        if isinstance(state_dict, dict) and len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        required_keys(state_dict, ("scale", "growth_factor", "backoff_factor", "growth_interval",
                                   "_growth_tracker"), type(self).__name__)
        # Every value is checked before any is set, so a bad state dict leaves the scaler as it was.
        scale = checked_scale(state_dict["scale"])
        growth = checked_growth_factor(state_dict["growth_factor"])
        backoff = checked_backoff_factor(state_dict["backoff_factor"])
        interval = checked_growth_interval(state_dict["growth_interval"])
        self._growth_tracker = checked_growth_tracker(state_dict["_growth_tracker"])
        self._set_scale(scale)
        self._growth_factor, self._backoff_factor, self._growth_interval = growth, backoff, interval

    # Bookkeeping.

    def _set_scale(self, scale: float) -> None:
        """Restore a checked scale: the next `scale()` starts from it (rounded to FP32 if one ran)."""
        self._init_scale = scale
        if self._scale is not None:
            self._scale = to_fp32(scale)

    def _state(self, optimizer) -> OptimizerState:
        return self._per_optimizer.setdefault(id(optimizer), OptimizerState())

    def _require_scale(self, method: str) -> None:
        if self._scale is None:
            raise AssertionError(f"{method}() was called before scale(): scale the loss with "
                               "scaler.scale(loss) earlier in the iteration.")


class StaticLossScaler(GradScaler):
    """A loss scale that never changes (the scheme before dynamic scaling).

    It multiplies the loss by `scale`, unscales the gradients and skips steps whose gradients
    overflowed, exactly like `GradScaler`, but `update` keeps the scale: choosing it is your job.
    Too small and small gradients still underflow; too large and every step overflows and is
    skipped, forever.
    """

    def __init__(self, scale: float):
        super().__init__(init_scale=scale)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """End the iteration; the scale stays as it is."""
        if new_scale is not None:
            raise ValueError(f"a StaticLossScaler's scale is fixed, got new_scale={new_scale}; "
                             "use GradScaler for a scale that changes")
        self._require_scale("update")
        self._per_optimizer = {}

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.get_scale()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the scale that `state_dict` returned (a finite positive number)."""
        required_keys(state_dict, ("scale",), type(self).__name__)
        self._set_scale(checked_scale(state_dict["scale"]))
