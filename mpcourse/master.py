"""FP32 master weights for a model whose parameters are 16-bit (lesson 04).

An update much smaller than the weight it is added to disappears in a 16-bit sum: near 1.0 the
FP16 values are 2**-10 apart, so 1.0 + 1e-4 rounds back to 1.0, and BF16 (2**-7 apart) is worse.
Training with 16-bit weights alone therefore stalls once the updates become small. The remedy
(Micikevicius et al., 2018) is to keep an FP32 copy of every weight, the master, to apply the
optimizer to the master, and to round it to 16 bits only to refresh the working copy that the
forward and backward passes use.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable

import torch

WORKING_DTYPES = (torch.float16, torch.bfloat16)


class MasterWeightOptimizer:
    """Run `optimizer_cls` on FP32 masters of 16-bit working parameters.

    `MasterWeightOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)` makes one FP32
    master copy of each working parameter, once, and builds the inner optimizer on the masters
    (so its state, e.g. Adam's moments, is FP32 too). Then, each iteration:

    1. Backward: the moment autograd has finished a working parameter's 16-bit gradient, a hook
       copies it (exactly) into the master's FP32 `.grad`.
    2. `step()` runs the inner optimizer on the masters and writes each master back into its
       working parameter, rounding to the nearest 16-bit value (ties to even).

    Why the copy happens in backward rather than in `step()`: everything that looks at the
    gradients between backward and step must see the master gradients. `param_groups` is the
    inner optimizer's, holding the masters, so a loss scaler (ours or `torch.amp.GradScaler`)
    unscales and checks the FP32 master gradients, where small values survive the division and
    where FP16 gradients would be refused ("Attempting to unscale FP16 gradients."). Clip
    `master_parameters()`, after `scaler.unscale_(optimizer)`: clipping the model's own 16-bit
    gradients changes nothing the optimizer uses.

    Gradients therefore reach the masters only through backward; a `.grad` assigned by hand to a
    working parameter is not seen. For a learning-rate scheduler, give it the inner optimizer,
    `optimizer.optimizer`: it shares the parameter groups.
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict], optimizer_cls: type,
                 **optimizer_kwargs: Any):
        groups = list(params)
        if not groups:
            raise ValueError("MasterWeightOptimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        master_groups = []
        for group in groups:
            workings = [group["params"]] if isinstance(group["params"], torch.Tensor) \
                else list(group["params"])
            masters = [self._add_master(working) for working in workings]
            master_groups.append({**group, "params": masters})
        self.optimizer = optimizer_cls(master_groups, **optimizer_kwargs)

    def _add_master(self, working: torch.Tensor) -> torch.Tensor:
        if not isinstance(working, torch.Tensor) or working.dtype not in WORKING_DTYPES:
            what = working.dtype if isinstance(working, torch.Tensor) else type(working).__name__
            raise ValueError(
                f"MasterWeightOptimizer needs 16-bit working parameters (torch.float16 or "
                f"torch.bfloat16), got {what}. FP32 parameters are their own masters: "
                "give them to the optimizer directly.")
        if not (working.is_leaf and working.requires_grad):
            raise ValueError("working parameters must be leaf tensors with requires_grad=True, "
                             f"got one of shape {tuple(working.shape)} that is not")
        if any(working is w for w, _ in self._pairs):
            raise ValueError(f"a parameter of shape {tuple(working.shape)} was given twice")
        master = working.detach().float().requires_grad_(True)
        working.register_post_accumulate_grad_hook(_copy_grad_into(master))
        self._pairs.append((working, master))
        return master

    @property
    def param_groups(self) -> list[dict]:
        """The inner optimizer's parameter groups: they hold the FP32 masters."""
        return self.optimizer.param_groups

    @property
    def state(self) -> dict:
        """The inner optimizer's per-master state (FP32)."""
        return self.optimizer.state

    def master_parameters(self) -> list[torch.Tensor]:
        """The FP32 masters, in the order the working parameters were given (e.g. to clip)."""
        return [master for _, master in self._pairs]

    @torch.no_grad()
    def step(self) -> None:
        """Update the masters with the inner optimizer, then round them into the working copies."""
        self.optimizer.step()
        for working, master in self._pairs:
            working.copy_(master)  # an FP32 -> 16-bit cast: round to nearest, ties to even

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of both the working parameters and the masters."""
        for working, master in self._pairs:
            for param in (working, master):
                if set_to_none:
                    param.grad = None
                elif param.grad is not None:
                    param.grad.detach_().zero_()

    def state_dict(self) -> dict[str, Any]:
        """A snapshot of the masters and the inner optimizer's state (later steps don't alter it).

        The masters must be saved: the 16-bit model weights are only their rounded copies.
        """
        return {"masters": [master.detach().clone() for master in self.master_parameters()],
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a `state_dict()`; the working parameters are refreshed from the masters."""
        saved = state_dict["masters"]
        if len(saved) != len(self._pairs):
            raise ValueError(f"the state dict holds {len(saved)} masters, this optimizer has "
                             f"{len(self._pairs)}")
        for (_, master), value in zip(self._pairs, saved):
            if value.shape != master.shape:
                raise ValueError(f"a saved master has shape {tuple(value.shape)}, the parameter "
                                 f"{tuple(master.shape)}")
        self.optimizer.load_state_dict(copy.deepcopy(state_dict["optimizer"]))
        with torch.no_grad():
            for (working, master), value in zip(self._pairs, saved):
                master.copy_(value)
                working.copy_(master)


def _copy_grad_into(master: torch.Tensor):
    """A post-accumulate-grad hook that copies a working gradient into `master.grad` in FP32."""
    def hook(working: torch.Tensor) -> None:
        if master.grad is None:
            master.grad = working.grad.float()
        else:
            master.grad.copy_(working.grad)
    return hook
