"""Kahan-compensated 16-bit weights: a second 16-bit number keeps what rounding took (lesson 11).

Kahan summation adds many small numbers to a large one without losing them: beside the running
sum it keeps a compensation, the part of each addition that rounding threw away, and adds it
back in the next addition. For weights, the sum is the 16-bit weight and the additions are the
optimizer's updates. The true weight is then `weight + compensation`: two BF16 numbers of 8
significant bits each, which together carry about 16 significant bits (the compensation starts
where the weight's bits end), not FP32's 24, at 4 bytes instead of a 16-bit weight plus an FP32
master's 6.

Two forms compute it:

- `compensated_add` forms `weight + compensation + update` in FP32 and splits the result into
  a weight rounded to nearest and the compensation (what `KahanOptimizer` does around any
  optimizer);
- `classic_kahan_add` is the form optimi's for-loop and foreach paths (`kahan_sum=True`, read in
  0.3.3) and torchdistX's AnyPrecisionAdamW run, with weight and compensation stored in BF16 and
  four roundings: add the FP32 update into the compensation (one rounding), add the compensation
  into the weight, and keep in the compensation what the weight did not take (one each).
  optimi's Triton kernel (0.3+, its default on CUDA) differs: it holds the compensation plus
  the update in FP32 registers within the step and rounds only what it stores.

Unlike stochastic rounding it is deterministic, and so are its errors: the compensation is
itself rounded to BF16 at every step, losing up to 2**-8 of its value, and an update of fixed
size lands on the compensation's grid the same way step after step, so that loss does not
average out. It accumulates in proportion to the distance travelled.
"""
from __future__ import annotations

import torch

from mpcourse.optim.stochastic import LowPrecisionWeightOptimizer


def compensated_add(weight: torch.Tensor, compensation: torch.Tensor,
                    update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight + compensation) + update, returned again as a 16-bit weight and its compensation.

    The sum is formed in FP32, rounded to nearest into the weight's dtype, and what that rounding
    lost becomes the new compensation (itself rounded to the compensation's dtype).
    """
    _check_same_shape(weight, compensation, update)
    exact = weight.float() + compensation.float() + update.float()
    return split(exact, weight.dtype, compensation.dtype)


def classic_kahan_add(weight: torch.Tensor, compensation: torch.Tensor,
                      update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same sum kept in 16-bit tensors, in optimi's order and with its four roundings:
    compensation += update; old = weight; weight += compensation; compensation += old - weight.

    The FP32 `update` is added into the compensation as optimi's `addcdiv_` adds it: in FP32,
    rounded once to the compensation's dtype (the update itself is never rounded on its own).
    The three other operations take 16-bit operands and round their result to the weight's
    dtype, as optimi's in-place `add_` and `sub_` on BF16 tensors do.
    """
    _check_same_shape(weight, compensation, update)
    compensation = (compensation.float() + update.float()).to(compensation.dtype)
    new_weight = weight + compensation
    return new_weight, compensation + (weight - new_weight)


def split(exact: torch.Tensor, weight_dtype: torch.dtype,
          compensation_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 `exact` as a rounded weight plus the compensation that rounding lost."""
    for name, dtype in (("weight_dtype", weight_dtype), ("compensation_dtype", compensation_dtype)):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point torch dtype such as torch.bfloat16, "
                            f"got {dtype!r}")
    weight = exact.to(weight_dtype)
    return weight, (exact - weight.float()).to(compensation_dtype)


def _check_same_shape(weight: torch.Tensor, compensation: torch.Tensor, update: torch.Tensor) -> None:
    """Refuse operands that are not floating-point tensors of one shape (a broadcast would hide a bug)."""
    operands = {"weight": weight, "compensation": compensation, "update": update}
    for name, tensor in operands.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got "
                            f"{getattr(tensor, 'dtype', type(tensor).__name__)}")
    shapes = {name: tuple(tensor.shape) for name, tensor in operands.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"weight, compensation and update must have one shape, got {shapes}")


class KahanOptimizer(LowPrecisionWeightOptimizer):
    """Any optimizer on 16-bit weights, each with a 16-bit compensation buffer.

    `KahanOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)`: the inner optimizer
    updates `weight + compensation` in FP32; the result is split back into a weight rounded to
    nearest and the compensation (`state[weight]["compensation"]`, in the weight's dtype).
    """

    def new_weight_state(self, working: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"compensation": torch.zeros_like(working)}

    def exact_weight(self, working: torch.Tensor) -> torch.Tensor:
        return working.float() + self.weight_state[working]["compensation"].float()

    def store(self, working: torch.Tensor, exact: torch.Tensor) -> None:
        compensation = self.weight_state[working]["compensation"]
        weight, lost = split(exact, working.dtype, compensation.dtype)
        working.copy_(weight)
        compensation.copy_(lost)
