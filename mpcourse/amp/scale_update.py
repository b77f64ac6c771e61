"""The dynamic loss scale's rule, and what a valid scale is (lesson 05).

`update_scale` is the pure rule a `GradScaler` applies after each iteration. The checks below
are the one place that says which scales and growth trackers a scaler may hold, whether they
arrive through `update(new_scale)`, a constructor or `load_state_dict`.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import torch


def to_fp32(x: float) -> float:
    """`x` rounded to the nearest FP32 value (ties to even), as a Python float."""
    return torch.tensor(x, dtype=torch.float64).float().item()


def update_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float,
                 backoff_factor: float, growth_interval: int) -> tuple[float, int]:
    """The dynamic scaling rule: the new (scale, growth_tracker) after one iteration.

    This is `torch._amp_update_scale_` in Python. The scale is an FP32 number; each product is
    computed in double precision and rounded once to FP32, as torch's kernels do.

    - An overflow (inf or NaN in any gradient) multiplies the scale by `backoff_factor` and
      restarts the count of clean iterations.
    - A clean iteration adds one to the count; the `growth_interval`-th clean iteration in a row
      multiplies the scale by `growth_factor` and restarts the count. A growth that would make the
      scale infinite is not taken (the count still restarts).

    A scale or factor that no scaler can hold (NaN, infinite, zero, negative; a negative or
    fractional tracker) is refused by the checks below, as `GradScaler` refuses them.
    """
    checked_scale(scale, reached=True)
    checked_growth_tracker(growth_tracker)
    checked_growth_factor(growth_factor), checked_backoff_factor(backoff_factor)
    checked_growth_interval(growth_interval)
    if found_inf:
        return to_fp32(scale * backoff_factor), 0
    clean_iterations = growth_tracker + 1
    if clean_iterations == growth_interval:
        grown = to_fp32(scale * growth_factor)
        return (grown if math.isfinite(grown) else scale), 0
    return scale, clean_iterations


def checked_scale(value: Any, name: str = "scale", reached: bool = False) -> float:
    """`value` as a loss scale: a real number, finite and positive (a NaN, infinite, zero or
    negative scale would make every gradient NaN, inf or zero, and training stop silently).

    `reached=True` also takes 0.0, which the rule itself reaches when backing off takes the
    scale below FP32's smallest subnormal: a scale the update may be handed, never one to set.
    """
    allowed = "a finite number >= 0" if reached else "a positive finite number"
    if not _is_number(value):
        raise ValueError(f"{name} must be {allowed}, got {value!r} of type {type(value).__name__}")
    if not (math.isfinite(value) and (value > 0 or reached and value == 0)):
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return float(value)


def checked_growth_factor(value: Any) -> float:
    """`value` as a growth factor: a finite number above 1 (the scale must grow, and stay finite)."""
    if not (_is_number(value) and 1.0 < value < math.inf):
        raise ValueError(f"growth_factor must be a finite number > 1.0, got {value!r}")
    return float(value)


def checked_backoff_factor(value: Any) -> float:
    """`value` as a backoff factor: a number strictly between 0 and 1 (the scale must shrink)."""
    if not (_is_number(value) and 0.0 < value < 1.0):
        raise ValueError(f"backoff_factor must be a number in (0, 1), got {value!r}")
    return float(value)


def checked_growth_interval(value: Any) -> int:
    """`value` as a growth interval: a whole number of clean iterations, at least 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"growth_interval must be an integer >= 1, got {value!r}")
    return int(value)


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def checked_growth_tracker(value: Any) -> int:
    """`value` as a growth tracker: the count of clean iterations in a row, a whole number >= 0."""
    if not _is_number(value) or not math.isfinite(value) or value < 0 or value != int(value):
        raise ValueError(f"_growth_tracker must be a non-negative integer (clean iterations in a "
                         f"row), got {value!r}")
    return int(value)


def required_keys(state_dict: Any, keys: tuple[str, ...], owner: str) -> None:
    """Refuse a state dict that is no dict or lacks any of `keys`, naming the missing ones."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"{owner}.load_state_dict needs a dict, got {type(state_dict).__name__}")
    missing = [key for key in keys if key not in state_dict]
    if missing:
        raise ValueError(f"{owner} state dict lacks {', '.join(map(repr, missing))}; it needs "
                         f"{', '.join(map(repr, keys))} (as its state_dict() writes them)")


def checked_new_scale(new_scale: Any) -> float:
    """`new_scale` as the FP32 scale, raising what torch raises for what torch refuses.

    torch takes a Python float or a 0-d tensor without grad. Other values fail inside torch with
    AttributeError (an int, a str), AssertionError (a tensor of several elements or requiring
    grad) or RuntimeError (a tensor of shape (1,), a float beyond FP32's range); the same types
    are raised here, with messages that say what was wrong. A NaN, infinite, zero or negative
    value, which torch takes, is refused by `checked_scale` (ValueError).
    """
    allowed = "a float or a 0-d tensor with requires_grad=False"
    if isinstance(new_scale, torch.Tensor):
        if new_scale.numel() != 1 or new_scale.requires_grad:
            raise AssertionError(f"new_scale must be {allowed}, got a tensor of shape "
                                 f"{tuple(new_scale.shape)} with requires_grad="
                                 f"{new_scale.requires_grad}")
        if new_scale.dim() != 0:
            raise RuntimeError(f"new_scale must be {allowed}, got a one-element tensor of shape "
                               f"{tuple(new_scale.shape)}: pass new_scale.reshape(())")
        value = new_scale.item()
    elif isinstance(new_scale, float):
        value = new_scale
    else:
        raise AttributeError(f"new_scale must be {allowed}, got {new_scale!r} of type "
                             f"{type(new_scale).__name__}")
    scale = to_fp32(checked_scale(value, "new_scale"))
    if math.isinf(scale):
        raise RuntimeError(f"new_scale={value} is beyond the largest FP32 number, "
                           f"{torch.finfo(torch.float32).max:.6g}")
    return scale
