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
import weakref
from typing import Any, Callable, Iterable

import torch

WORKING_DTYPES = (torch.float16, torch.bfloat16)


class MasterWeightOptimizer(torch.optim.Optimizer):
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
    `master_parameters()`, after `scaler.unscale_(optimizer)`.

    It is a `torch.optim.Optimizer` whose `param_groups` and `state` are the inner optimizer's,
    so learning-rate schedulers, `add_param_group` (masters are made for the new parameters),
    `state_dict`, step hooks and `step(closure)` (LBFGS) work as with any optimizer. As with any
    optimizer, a parameter without a gradient, e.g. a frozen one, is left alone by `step()`.

    A gradient put on a working parameter by other means than backward (assigned to `.grad`,
    or changed in place) is copied into its master when `step()` starts. A working gradient
    changed *after* its master gradient was (say, unscaled) is an error: which one should the
    step use? Changes are seen through tensors' version counters, and one kernel leaves those
    alone: `torch.amp.GradScaler.unscale_`'s. After it (not after ours), an edited working
    gradient replaces the unscaled master one unnoticed, so edit `master_parameters()`' gradients.
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict], optimizer_cls: type,
                 **optimizer_kwargs: Any):
        self._make_optimizer = lambda groups: optimizer_cls(groups, **optimizer_kwargs)
        self.optimizer: torch.optim.Optimizer | None = None
        self._pairs: list[_Pair] = []
        self._working_ids: set[int] = set()
        super().__init__(params, defaults={})  # calls add_param_group for each group

    def add_param_group(self, param_group: dict) -> None:
        """Make FP32 masters for the group's 16-bit parameters and add them to the inner optimizer.

        The group's other entries (lr, weight_decay, ...) go with the masters. `(name, tensor)`
        pairs, as from `named_parameters()`, keep their names.
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        entries = param_group["params"]
        if isinstance(entries, (set, frozenset)):
            raise TypeError("parameters must be an ordered collection such as a list, not a set: "
                            "a set's order changes between runs")
        entries = [entries] if isinstance(entries, torch.Tensor) else list(entries)
        workings = [e[1] if isinstance(e, tuple) else e for e in entries]
        self._check_working(workings)
        pairs = [_Pair(working) for working in workings]
        masters = [(e[0], pair.master) if isinstance(e, tuple) else pair.master
                   for e, pair in zip(entries, pairs)]
        master_group = {**param_group, "params": masters}
        if self.optimizer is None:
            self.optimizer = self._make_optimizer([master_group])
            self.param_groups, self.state = self.optimizer.param_groups, self.optimizer.state
            self.defaults = self.optimizer.defaults
        else:
            self.optimizer.add_param_group(master_group)
        self._pairs.extend(pairs)
        self._working_ids.update(id(w) for w in workings)

    def _check_working(self, workings: list) -> None:
        seen = set(self._working_ids)
        for working in workings:
            if not isinstance(working, torch.Tensor) or working.dtype not in WORKING_DTYPES:
                what = working.dtype if isinstance(working, torch.Tensor) \
                    else type(working).__name__
                raise ValueError(
                    f"MasterWeightOptimizer needs 16-bit working parameters (torch.float16 or "
                    f"torch.bfloat16), got {what}. FP32 parameters are their own masters: "
                    "give them to the optimizer directly.")
            if not working.is_leaf:
                raise ValueError("working parameters must be leaf tensors (an optimizer cannot "
                                 f"update a computed tensor), got one of shape "
                                 f"{tuple(working.shape)} made by {working.grad_fn.name()}")
            if id(working) in seen:
                raise ValueError(f"a parameter of shape {tuple(working.shape)} was given twice")
            seen.add(id(working))

    def master_parameters(self) -> list[torch.Tensor]:
        """The FP32 masters, in the order the working parameters were given (e.g. to clip)."""
        return [pair.master for pair in self._pairs]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update the masters with the inner optimizer, then round them into the working copies.

        A `closure` re-evaluates the model: before each call the working copies are refreshed
        from the masters, so the model computes with the weights the inner optimizer is trying.
        """
        self._check_inner_groups()
        for pair in self._pairs:
            pair.take_working_gradient()
        loss = self.optimizer.step(None if closure is None else self._on_masters(closure))
        self._round_into_working()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of both the working parameters and the masters."""
        for pair in self._pairs:
            for param in (pair.working, pair.master):
                if set_to_none:
                    param.grad = None
                elif param.grad is not None:
                    param.grad.detach_().zero_()
            pair.remember_gradients()

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict plus the masters, as a snapshot later steps don't alter.

        The masters must be saved: the 16-bit model weights are only their rounded copies.
        """
        state = copy.deepcopy(super().state_dict())
        state["masters"] = [master.detach().clone() for master in self.master_parameters()]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a `state_dict()`; the working parameters are refreshed from the masters."""
        if "masters" not in state_dict:
            raise ValueError("the state dict holds no 'masters': load one saved by "
                             f"MasterWeightOptimizer.state_dict(), got keys {sorted(state_dict)}")
        saved = state_dict["masters"]
        if len(saved) != len(self._pairs):
            raise ValueError(f"the state dict holds {len(saved)} masters, this optimizer has "
                             f"{len(self._pairs)}")
        for pair, value in zip(self._pairs, saved):
            if value.shape != pair.master.shape:
                raise ValueError(f"a saved master has shape {tuple(value.shape)}, the parameter "
                                 f"{tuple(pair.master.shape)}")
        inner = {key: value for key, value in state_dict.items() if key != "masters"}
        super().load_state_dict(copy.deepcopy(inner))
        self.optimizer.__setstate__({"state": self.state, "param_groups": self.param_groups})
        with torch.no_grad():
            for pair, value in zip(self._pairs, saved):
                pair.master.copy_(value)
                pair.working.copy_(pair.master)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a MasterWeightOptimizer is bound to its model's parameters by gradient "
                        "hooks and cannot be copied or pickled: save state_dict() and load it "
                        "into one built on the new model's parameters")

    def _on_masters(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        def evaluate() -> Any:
            self._round_into_working()
            with torch.enable_grad():
                loss = closure()
            for pair in self._pairs:
                pair.take_working_gradient()
            return loss
        return evaluate

    @torch.no_grad()
    def _round_into_working(self) -> None:
        for pair in self._pairs:
            if pair.master.grad is not None:  # the inner optimizer leaves the others unchanged
                pair.working.copy_(pair.master)  # FP32 -> 16 bits: round to nearest, ties to even

    def _check_inner_groups(self) -> None:
        """Parameters added to the inner optimizer directly would train without masters."""
        if sum(len(group["params"]) for group in self.param_groups) == len(self._pairs):
            return
        masters = {id(pair.master) for pair in self._pairs}
        strays = [p for group in self.param_groups for p in group["params"]
                  if id(p) not in masters]
        raise ValueError(
            f"the inner optimizer holds {len(strays)} parameter(s) without a master (first: "
            f"{strays[0].dtype}, shape {tuple(strays[0].shape)}): add parameter groups with "
            "MasterWeightOptimizer.add_param_group, which makes their masters, not with "
            ".optimizer.add_param_group")


class _Pair:
    """A working parameter, its FP32 master, and which gradients were last made equal in both."""

    def __init__(self, working: torch.Tensor):
        self.working = working
        self.master = working.detach().float().requires_grad_(True)
        self.copied: tuple[_Seen, _Seen] | None = None
        # A frozen parameter is unfrozen for a moment to take the hook, so that if it is unfrozen
        # later its gradients still reach the master in backward, before a loss scaler looks.
        frozen = not working.requires_grad
        working.requires_grad_(True)
        working.register_post_accumulate_grad_hook(lambda _: self.copy_gradient())
        working.requires_grad_(not frozen)

    def copy_gradient(self) -> None:
        """Make the master's gradient the working gradient in FP32 (exact: 16 -> 32 bits)."""
        grad = self.working.grad
        if grad is None:
            self.master.grad = None
        elif self.master.grad is None or self.master.grad.shape != grad.shape:
            self.master.grad = grad.float()
        else:
            self.master.grad.copy_(grad)
        self.remember_gradients()

    def remember_gradients(self) -> None:
        self.copied = (_Seen(self.working.grad), _Seen(self.master.grad))

    def take_working_gradient(self) -> None:
        """Copy the working gradient if it changed since backward's copy, e.g. assigned by hand."""
        working_seen, master_seen = self.copied or (None, None)
        if self.copied is None and self.working.grad is None:
            return  # never a working gradient: the master's own, if any, stands
        if working_seen is not None and working_seen.is_(self.working.grad):
            return  # the master has it already (and it may have been unscaled or clipped since)
        if master_seen is not None and not master_seen.is_(self.master.grad):
            raise RuntimeError(
                "the gradient of a working parameter of shape "
                f"{tuple(self.working.shape)} was changed after its FP32 master gradient was "
                "(e.g. unscaled by a loss scaler), so it is unclear which one the step should "
                "use. After backward, change the gradients of master_parameters() only.")
        self.copy_gradient()


class _Seen:
    """Which tensor (by identity, without keeping it alive) and which in-place version of it."""

    def __init__(self, tensor: torch.Tensor | None):
        self.ref = None if tensor is None else weakref.ref(tensor)
        self.version = None if tensor is None else tensor._version

    def is_(self, tensor: torch.Tensor | None) -> bool:
        if tensor is None or self.ref is None:
            return tensor is None and self.ref is None
        return self.ref() is tensor and tensor._version == self.version
