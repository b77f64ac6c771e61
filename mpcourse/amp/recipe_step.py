"""One real training step of a precision recipe, and each tensor's dtype in it (lessons 03 to 06).

A recipe is three switches: the parameters' dtype (16-bit ones get FP32 masters through
`MasterWeightOptimizer`), the dtype `torch.autocast` runs the forward pass in (or none), and
whether `torch.amp.GradScaler` scales the loss. `step_dtypes` runs one AdamW step of a small
two-layer model in the recipe and records what torch really made of each tensor, so a lesson's
picture of the recipe (`mpcourse.views.diagrams.dtype_flow`) cannot drift from torch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mpcourse.numbers import precision
from mpcourse.amp.master import MasterWeightOptimizer

PARAM_DTYPES = (torch.float32, *precision.AUTOCAST_DTYPES.values())
AUTOCAST_CHOICES = (None, *precision.AUTOCAST_DTYPES.values())


@dataclass(frozen=True)
class Recipe:
    """The three switches of a mixed-precision recipe."""
    param_dtype: torch.dtype = torch.float32
    autocast_dtype: torch.dtype | None = None   # None: no autocast
    grad_scaler: bool = False

    def __post_init__(self):
        if self.param_dtype not in PARAM_DTYPES:
            raise ValueError(f"param_dtype must be one of {PARAM_DTYPES}, got {self.param_dtype!r}")
        if self.autocast_dtype not in AUTOCAST_CHOICES:
            raise ValueError(f"autocast_dtype must be one of {AUTOCAST_CHOICES}, "
                             f"got {self.autocast_dtype!r}")
        if not isinstance(self.grad_scaler, bool):
            raise TypeError(f"grad_scaler must be True or False, got {self.grad_scaler!r}")


@dataclass(frozen=True)
class StepDtypes:
    """The dtypes of the tensors of one real training step, recorded while it ran."""
    recipe: Recipe
    parameter: torch.dtype          # the model's parameters as stored
    matmul_operand: torch.dtype     # the weight the forward matmul kernel (aten.addmm) received
    activation: torch.dtype         # a linear layer's output
    loss: torch.dtype
    scaled_loss: torch.dtype | None  # None: no loss scaling
    activation_grad: torch.dtype    # the gradient flowing back into that activation
    parameter_grad: torch.dtype     # .grad of a model parameter
    optimizer_grad: torch.dtype     # .grad of what the optimizer updates (the master, if any)
    optimizer_param: torch.dtype    # what the optimizer updates
    optimizer_state: torch.dtype    # AdamW's exp_avg

    def tensor_dtypes(self) -> dict[str, torch.dtype | None]:
        """Each recorded tensor's name and dtype, in the order of the step."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "recipe"}


class _MatmulOperands(TorchDispatchMode):
    """Records the dtypes of the operands of the first addmm/mm the kernels receive."""

    def __init__(self):
        super().__init__()
        self.dtypes: list[torch.dtype] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.dtypes is None and func.overloadpacket in (torch.ops.aten.addmm, torch.ops.aten.mm):
            self.dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor)]
        return func(*args, **(kwargs or {}))


def step_dtypes(param_dtype: torch.dtype = torch.float32, autocast_dtype: torch.dtype | None = None,
                grad_scaler: bool = False) -> StepDtypes:
    """Run one AdamW step of a two-layer model in a recipe and record its tensors' dtypes.

    The recipe: parameters in `param_dtype` (16-bit ones get FP32 masters through
    `MasterWeightOptimizer`), the forward pass under `torch.autocast("cpu", autocast_dtype)`
    unless it is None, and `torch.amp.GradScaler` if `grad_scaler`.
    """
    recipe = Recipe(param_dtype, autocast_dtype, grad_scaler)
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(param_dtype)
    masters = param_dtype != torch.float32
    optimizer = (MasterWeightOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3) if masters
                 else torch.optim.AdamW(model.parameters(), lr=1e-3))
    # A modest initial scale, so that the one step is not skipped for an overflow.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, enabled=grad_scaler)
    x = torch.randn(4, 8, generator=generator).to(param_dtype)
    target = torch.tensor([0, 3, 1, 2])
    seen: dict[str, torch.dtype] = {}
    operands = _MatmulOperands()
    region = (torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None
              else contextlib.nullcontext())
    with operands:
        with region:
            hidden = model[0](x)
            hidden.register_hook(lambda grad: seen.__setitem__("activation_grad", grad.dtype))
            loss = nn.functional.cross_entropy(model[2](model[1](hidden)), target)
        scaled = scaler.scale(loss)
        scaled.backward()
    scaler.unscale_(optimizer)
    updated = optimizer.param_groups[0]["params"][0]
    torch.nn.utils.clip_grad_norm_(updated, max_norm=1.0)
    optimizer_grad = updated.grad.dtype
    scaler.step(optimizer)
    scaler.update()
    if not optimizer.state:
        raise RuntimeError("the recorded step was skipped for an overflow; nothing was recorded")
    return StepDtypes(recipe=recipe, parameter=model[0].weight.dtype,
                      matmul_operand=operands.dtypes[-1], activation=hidden.dtype, loss=loss.dtype,
                      scaled_loss=scaled.dtype if grad_scaler else None,
                      activation_grad=seen["activation_grad"],
                      parameter_grad=model[0].weight.grad.dtype, optimizer_grad=optimizer_grad,
                      optimizer_param=updated.dtype,
                      optimizer_state=optimizer.state[updated]["exp_avg"].dtype)
