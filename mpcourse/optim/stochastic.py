"""Stochastic rounding, and an optimizer that writes 16-bit weights with it (lesson 11).

Rounding to nearest sends an update smaller than half the gap between two 16-bit neighbours
straight back to the old weight, every time (lesson 04). Stochastic rounding instead goes up with
probability equal to how far the exact value lies towards the upper neighbour, so the stored
weight is right *on average*: the small updates survive as a random walk whose mean is the exact
trajectory. It costs no memory, only random bits; its price is variance.

`stochastic_round` is lesson 01's `round_to(..., rounding="stochastic")`; with the random bits
given it is deterministic, which is how the tests compare it with an independent reference.

`LowPrecisionWeightOptimizer` runs any torch optimizer on 16-bit weights: at each step it hands
the inner optimizer an FP32 copy of every weight that exists only during `step()`, then writes
the result back to 16 bits. How it writes back is the subclass's choice:
`StochasticRoundingOptimizer` rounds stochastically (torchao's `bf16_stochastic_round=True`),
`mpcourse.optim.kahan.KahanOptimizer` keeps a compensation buffer.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from mpcourse.numbers.float_format import BF16, FloatFormat
from mpcourse.numbers.rounding import round_to

#: The dtypes of the 16-bit weights these optimizers update (`as_format` gives each one's format).
WEIGHT_DTYPES = (torch.bfloat16, torch.float16)


def stochastic_round(x: torch.Tensor, fmt: FloatFormat | torch.dtype | str = BF16, *,
                     generator: torch.Generator | None = None,
                     random_bits: torch.Tensor | None = None) -> torch.Tensor:
    """`x` rounded stochastically to `fmt` (a format, dtype or name: see `as_format`), as float32
    values on `fmt`'s grid.

    Each value becomes its lower neighbour `lo` or upper neighbour `hi` (by magnitude), `hi` with
    probability (|x| - lo) / (hi - lo), so the expected result is exactly x. `random_bits` (int32,
    the shape of x) fixes the draw: the rounding then adds `random_bits & dropped_mask` to the
    bit pattern before clearing the dropped bits, with no randomness left.
    """
    return round_to(x, fmt, rounding="stochastic", generator=generator, random_bits=random_bits)


class LowPrecisionWeightOptimizer:
    """Run `optimizer_cls` on 16-bit weights through FP32 copies that live only inside `step()`.

    Each working parameter gets a proxy parameter, which is what the inner optimizer sees and
    keys its state by. Between steps a proxy holds no data. In `step()`:

    1. each proxy receives the exact FP32 value of its weight (`exact_weight`) and the FP32
       gradient;
    2. the inner optimizer updates the proxies in FP32;
    3. `store` writes each result back into the 16-bit weight; the proxies are emptied.

    With `per_tensor=False` the FP32 copies of *every* weight and gradient exist together for
    the duration of one `step()`: 8 more bytes per parameter than the step keeps between steps.
    With `per_tensor=True` the step runs the three stages for one weight at a time, so the
    copies exist for one tensor at a time and the step's extra memory is bounded by the largest
    tensor, as in fused kernels (torchao, optimi), which work on one tensor, or one chunk of
    it, in registers. The results are the same: AdamW updates each tensor on its own.
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict], optimizer_cls: type,
                 per_tensor: bool = False, **optimizer_kwargs: Any):
        self.per_tensor = per_tensor
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.weight_state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        proxy_groups = []
        for group in groups:
            workings = [group["params"]] if isinstance(group["params"], torch.Tensor) \
                else list(group["params"])
            proxy_groups.append({**group, "params": [self._add(w) for w in workings]})
        self.optimizer = optimizer_cls(proxy_groups, **optimizer_kwargs)

    def _add(self, working: torch.Tensor) -> torch.Tensor:
        if not isinstance(working, torch.Tensor) or working.dtype not in WEIGHT_DTYPES:
            what = working.dtype if isinstance(working, torch.Tensor) else type(working).__name__
            raise ValueError(f"{type(self).__name__} updates 16-bit weights (torch.bfloat16 or "
                             f"torch.float16), got {what}")
        if not (working.is_leaf and working.requires_grad):
            raise ValueError("weights must be leaf tensors with requires_grad=True, got one of "
                             f"shape {tuple(working.shape)} that is not")
        if any(working is w for w, _ in self._pairs):
            raise ValueError(f"a parameter of shape {tuple(working.shape)} was given twice")
        proxy = torch.nn.Parameter(_empty(working))
        self._pairs.append((working, proxy))
        self.weight_state[working] = self.new_weight_state(working)
        return proxy

    def new_weight_state(self, working: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-weight tensors the write-back keeps between steps (none by default)."""
        return {}

    def exact_weight(self, working: torch.Tensor) -> torch.Tensor:
        """The FP32 value the inner optimizer updates: the 16-bit weight itself by default."""
        return working.float()

    def exact_gradient(self, working: torch.Tensor) -> torch.Tensor | None:
        """The FP32 gradient the inner optimizer uses (None: the weight is not stepped)."""
        return None if working.grad is None else working.grad.float()

    def store(self, working: torch.Tensor, exact: torch.Tensor) -> None:
        """Write the updated FP32 value into the 16-bit weight."""
        raise NotImplementedError(f"{type(self).__name__} must say how it writes weights back")

    @property
    def param_groups(self) -> list[dict]:
        """The inner optimizer's groups (holding the proxies): where lr lives, for schedulers."""
        return self.optimizer.param_groups

    @property
    def state(self) -> dict:
        """Everything kept between steps: the inner optimizer's state and the weights' own."""
        return {**self.optimizer.state, **self.weight_state}

    @torch.no_grad()
    def step(self) -> None:
        batches = [[pair] for pair in self._pairs] if self.per_tensor else [self._pairs]
        for pairs in batches:
            stepped = []
            for working, proxy in pairs:
                grad = self.exact_gradient(working)
                if grad is None:
                    continue
                proxy.data = self.exact_weight(working)
                proxy.grad = grad
                del grad
                stepped.append((working, proxy))
            if stepped:
                self.optimizer.step()
            for working, proxy in stepped:
                self.store(working, proxy.data)
                proxy.grad = None
                proxy.data = _empty(working)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for working, _ in self._pairs:
            if set_to_none:
                working.grad = None
            elif working.grad is not None:
                working.grad.detach_().zero_()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(),
                "weight_state": [{k: v.clone() for k, v in self.weight_state[w].items()}
                                 for w, _ in self._pairs]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["weight_state"]
        if len(saved) != len(self._pairs):
            raise ValueError(f"the state dict holds {len(saved)} weights' state, this optimizer "
                             f"has {len(self._pairs)} weights")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        with torch.no_grad():  # a master with an FP32 gradient requires grad
            for (working, _), values in zip(self._pairs, saved):
                for name, value in values.items():
                    self.weight_state[working][name].copy_(value)


def _empty(like: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32, device=like.device)


class StochasticRoundingOptimizer(LowPrecisionWeightOptimizer):
    """Any optimizer on 16-bit weights, writing each updated weight back by stochastic rounding.

    `StochasticRoundingOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)` keeps no FP32
    copy between steps: the weights cost 2 bytes each. `generator` seeds the rounding.
    """

    def __init__(self, params, optimizer_cls: type, generator: torch.Generator | None = None,
                 per_tensor: bool = False, **optimizer_kwargs: Any):
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
        self.generator = generator
        super().__init__(params, optimizer_cls, per_tensor, **optimizer_kwargs)

    def state_dict(self) -> dict[str, Any]:
        """The state, with the rounding generator's, so that a resumed run draws the same bits."""
        state = super().state_dict()
        if self.generator is not None:
            state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if self.generator is not None and "generator" in state_dict:
            self.generator.set_state(state_dict["generator"])

    def store(self, working: torch.Tensor, exact: torch.Tensor) -> None:
        working.copy_(stochastic_round(exact, working.dtype, generator=self.generator))
