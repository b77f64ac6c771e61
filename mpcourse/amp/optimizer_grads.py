"""One iteration of one optimizer, as a loss scaler sees it (lesson 05): where it is (its
`Stage`), its gradients, and whether any of them holds an inf or a NaN.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class Stage(enum.Enum):
    """Where one optimizer is in this iteration, as torch's `OptState`: after STEPPED only update()."""
    READY, UNSCALED, STEPPED = "ready", "unscaled", "stepped"


@dataclass
class OptimizerState:
    """One optimizer this iteration: its stage, and whether a gradient held inf or NaN."""
    stage: Stage = Stage.READY
    found_inf: bool | None = None  # None until checked, and for an optimizer with no gradient


def grads_of(optimizer) -> list[torch.Tensor]:
    """The gradients the optimizer will use (the stored values of a sparse gradient)."""
    grads = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                grads.append(param.grad._values() if param.grad.is_sparse else param.grad)
    return grads


def any_non_finite(grads: list[torch.Tensor]) -> bool | None:
    """Whether any gradient holds an inf or a NaN; None when there is no gradient to check."""
    if not grads:
        return None
    return any(not bool(torch.isfinite(grad).all()) for grad in grads)
