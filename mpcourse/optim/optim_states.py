"""AdamW whose moments are stored in FP32, BF16, or 8 bits with block-wise scales (lesson 11).

AdamW keeps two moments per parameter, the running mean of the gradient (`exp_avg`) and of its
square (`exp_avg_sq`): in FP32 that is 8 of the 16 bytes per parameter of lesson 02. The moments
are averages, so they tolerate rounding far better than the weights do, and large runs store them
smaller (`STATE_FORMATS`: the code of each moment):

- ``"bf16"``: each moment rounded to BF16 after every update (DeepSeek-V3 keeps AdamW's moments
  so): 4 bytes per parameter.
- 8 bits per value with one FP32 scale per block of `block_size` values
  (`mpcourse.optim.codebooks`), about 2 bytes per parameter:
  ``"e4m3"`` (both moments in FP8 E4M3: torchao's `AdamWFp8`), ``"dynamic"`` (the dynamic
  tree code, signed for m and unsigned for v: bitsandbytes' `AdamW8bit` and torchao's
  `AdamW8bit`), ``"e4m3+e5m2"`` (E4M3 for m, E5M2's wider range for v).

Like bitsandbytes and torchao, an 8-bit format quantizes only tensors of at least
`min_8bit_size` values (4,096 in both libraries) whose size divides by `block_size`; the others
keep their moments unquantized, in the parameter's dtype, as torchao does (bitsandbytes keeps
them in FP32), or in `unquantized_dtype` if given: an optimizer that sees FP32 copies of BF16
weights (`mpcourse.optim.stochastic`) passes torch.bfloat16 to store what torchao would.
`min_8bit_size=0` quantizes every tensor, padding a last, shorter block.

Every step decodes the moments to FP32, updates them and the weight in FP32, and encodes the
moments again; the weight update uses the FP32 moments of this step, before they are encoded.
The FP32 temporaries live for one tensor at a time (`step` visits the parameters in turn).
"""
from __future__ import annotations

import torch

from mpcourse.optim.codebooks import dequantize_blockwise, quantize_blockwise, storage_dtype

#: For each format, how the first and the second moment are stored.
STATE_FORMATS = {"fp32": ("fp32", "fp32"), "bf16": ("bf16", "bf16"), "e4m3": ("e4m3", "e4m3"),
                 "dynamic": ("dynamic", "dynamic_unsigned"), "e4m3+e5m2": ("e4m3", "e5m2")}
PLAIN_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MOMENTS = ("exp_avg", "exp_avg_sq")
MIN_8BIT_SIZE = 4096  # bitsandbytes' min_8bit_size; torchao's threshold too


def is_8bit(state_format: str) -> bool:
    return STATE_FORMATS[state_format][0] not in PLAIN_DTYPES


def quantizes(numel: int, state_format: str, block_size: int = 256,
              min_8bit_size: int = MIN_8BIT_SIZE) -> bool:
    """Whether a tensor of `numel` values gets 8-bit moments (torchao's policy: at least
    `min_8bit_size` values, and whole blocks)."""
    return (is_8bit(state_format) and numel >= min_8bit_size
            and (min_8bit_size == 0 or numel % block_size == 0))


class AdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) with its moments stored in `state_format`.

    The arithmetic is torch.optim.AdamW's, in FP32 whatever the storage: a 16-bit parameter is
    updated in FP32 and rounded to nearest once, at the end. `state[p]` holds, per moment, a
    tensor in the storage dtype, plus `<moment>_scale` where the moment is quantized.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, state_format: str = "fp32",
                 block_size: int = 256, min_8bit_size: int = MIN_8BIT_SIZE,
                 unquantized_dtype: torch.dtype | None = None):
        if state_format not in STATE_FORMATS:
            raise ValueError(f"unknown state_format {state_format!r}; choose one of "
                             f"{', '.join(STATE_FORMATS)}")
        for name, value, least in (("block_size", block_size, 1),
                                   ("min_8bit_size", min_8bit_size, 0)):
            if not (isinstance(value, int) and value >= least):
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if not lr >= 0 or not eps >= 0 or not weight_decay >= 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0, got lr={lr}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        self.state_format = state_format
        self.block_size = block_size
        self.min_8bit_size = min_8bit_size
        self.unquantized_dtype = unquantized_dtype
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict) -> None:
        """torchao's `single_param_adam`, value for value, with in-place operations where they
        give the same values, so that one tensor's step holds few FP32 temporaries."""
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            for name in MOMENTS:
                self._new_moment(state, name, p)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        lr = torch.tensor(group["lr"])
        weight = p.float()           # p itself if it is FP32, else an FP32 copy
        grad = p.grad.float()
        if group["weight_decay"]:
            weight = weight - lr * group["weight_decay"] * weight
        exp_avg = self._read(state, "exp_avg").lerp_(grad, 1 - beta1)
        exp_avg_sq = self._read(state, "exp_avg_sq").lerp_(grad.square(), 1 - beta2)
        del grad
        self._write(state, "exp_avg", exp_avg)
        self._write(state, "exp_avg_sq", exp_avg_sq)
        bias_correction1 = 1 - beta1 ** state["step"]
        bias_correction2 = 1 - beta2 ** state["step"]
        denom = exp_avg_sq.sqrt().div_(bias_correction2.sqrt()).add_(group["eps"])
        del exp_avg_sq
        update = (exp_avg / bias_correction1).mul_(lr).div_(denom)
        del exp_avg, denom
        if weight is p:
            p.sub_(update)
        else:
            p.copy_(weight.sub_(update))

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a `state_dict()`, keeping the moments in this optimizer's storage dtype.

        (torch.optim casts floating-point state to each parameter's dtype on loading; the
        cast to FP32 and back is exact for BF16 and FP8 values.)
        """
        super().load_state_dict(state_dict)
        for p, state in self.state.items():
            for name, code in zip(MOMENTS, STATE_FORMATS[self.state_format]):
                if name in state:
                    state[name] = state[name].to(self._moment_dtype(p, code))

    def _moment_dtype(self, p: torch.Tensor, code: str) -> torch.dtype:
        if code in PLAIN_DTYPES:
            return PLAIN_DTYPES[code]
        quantized = quantizes(p.numel(), self.state_format, self.block_size, self.min_8bit_size)
        return storage_dtype(code) if quantized else (self.unquantized_dtype or p.dtype)

    def _new_moment(self, state: dict, name: str, p: torch.Tensor) -> None:
        code = self._code(name)
        state[name] = torch.zeros(p.shape, dtype=self._moment_dtype(p, code), device=p.device)
        if code not in PLAIN_DTYPES and quantizes(p.numel(), self.state_format, self.block_size,
                                                  self.min_8bit_size):
            blocks = -(-p.numel() // self.block_size)
            state[name + "_scale"] = torch.zeros(blocks, device=p.device)

    def _code(self, name: str) -> str:
        return STATE_FORMATS[self.state_format][MOMENTS.index(name)]

    def _read(self, state: dict, name: str) -> torch.Tensor:
        """The moment in FP32: a decoded copy, or the stored FP32 tensor itself."""
        if name + "_scale" in state:
            return dequantize_blockwise(state[name], state[name + "_scale"], self._code(name),
                                        self.block_size)
        return state[name].float()

    def _write(self, state: dict, name: str, value: torch.Tensor) -> None:
        if name + "_scale" in state:
            codes, scale = quantize_blockwise(value, self._code(name), self.block_size)
            state[name].copy_(codes)
            state[name + "_scale"].copy_(scale)
        elif value is not state[name]:
            state[name].copy_(value)
