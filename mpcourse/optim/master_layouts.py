"""Lesson 04's layout, counted in bytes: 16-bit weights and gradients, FP32 masters (lesson 11).

Mixed-precision training as Micikevicius et al. (2018) and ZeRO (Rajbhandari et al., 2020) count
it keeps 2 + 2 + K bytes per parameter: a 16-bit weight, its 16-bit gradient, and K = 12 bytes of
optimizer state, the FP32 master and AdamW's two FP32 moments. `FP32MasterOptimizer` keeps
exactly that: the master is the optimizer's state, and the FP32 gradient the inner optimizer
needs is made from the 16-bit one inside `step()`.

With `fp32_gradients=True` the gradient is accumulated in FP32 instead (Megatron-LM's
`main_grad`): the moment backward finishes a 16-bit gradient, a hook adds it into an FP32 buffer
and frees it. That is 2 + 4 + 12 = 18 bytes, and what a run with gradient accumulation over
micro-batches wants, since many 16-bit additions would lose the small ones. Clip the gradients
of `master_parameters()`.

(`mpcourse.amp.master.MasterWeightOptimizer`, lesson 04's teaching version, keeps both the 16-bit
gradient and an FP32 copy made in backward: 20 bytes.)
"""
from __future__ import annotations

from typing import Any

import torch

from mpcourse.optim.stochastic import LowPrecisionWeightOptimizer


class FP32MasterOptimizer(LowPrecisionWeightOptimizer):
    """Any optimizer on FP32 masters of 16-bit weights: `state[weight]["master"]` is the FP32
    weight the inner optimizer updates in place; the 16-bit weight is it rounded to nearest."""

    def __init__(self, params, optimizer_cls: type, fp32_gradients: bool = False,
                 per_tensor: bool = False, **optimizer_kwargs: Any):
        self.fp32_gradients = fp32_gradients
        super().__init__(params, optimizer_cls, per_tensor, **optimizer_kwargs)
        if fp32_gradients:
            for working, _ in self._pairs:
                working.register_post_accumulate_grad_hook(self._accumulate)

    def new_weight_state(self, working: torch.Tensor) -> dict[str, torch.Tensor]:
        master = working.detach().float()
        if self.fp32_gradients:
            master.requires_grad_(True)  # its .grad is the FP32 accumulator
        return {"master": master}

    def master_parameters(self) -> list[torch.Tensor]:
        """The FP32 masters, in the order of the weights (with `fp32_gradients`, the tensors
        whose gradients to clip)."""
        return [self.weight_state[working]["master"] for working, _ in self._pairs]

    @torch.no_grad()
    def _accumulate(self, working: torch.Tensor) -> None:
        master = self.weight_state[working]["master"]
        if master.grad is None:
            master.grad = working.grad.float()
        else:
            master.grad.add_(working.grad)
        working.grad = None

    def exact_weight(self, working: torch.Tensor) -> torch.Tensor:
        return self.weight_state[working]["master"].detach()  # no copy: updated in place

    def exact_gradient(self, working: torch.Tensor) -> torch.Tensor | None:
        if self.fp32_gradients:
            return self.weight_state[working]["master"].grad
        return super().exact_gradient(working)

    def store(self, working: torch.Tensor, exact: torch.Tensor) -> None:
        working.copy_(exact)  # round to nearest

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        if self.fp32_gradients:
            for master in self.master_parameters():
                if set_to_none:
                    master.grad = None
                elif master.grad is not None:
                    master.grad.zero_()
