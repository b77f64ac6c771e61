"""AdamW whose moments are stored in FP32, BF16, or 8 bits with block-wise scales (lesson 11).

AdamW keeps two moments per parameter, the running mean of the gradient (`exp_avg`) and of its
square (`exp_avg_sq`): in FP32 that is 8 of the 16 bytes per parameter of lesson 02. The moments
are averages, so they tolerate rounding far better than the weights do, and large runs store them
smaller:

- ``"bf16"``: each moment rounded to BF16 after every update (DeepSeek-V3 keeps AdamW's moments
  so): 4 bytes per parameter.
- ``"8bit"``: each moment cut into blocks of `block_size` values; a block stores one FP32 scale
  (its largest magnitude divided by 448) and one 8-bit code per value, the value over the scale
  rounded to FP8 E4M3 (lesson 07). The idea is bitsandbytes' 8-bit Adam; this layout is
  torchao's `AdamWFp8`. About 2 bytes per parameter. A block shares its scale, so one outlier
  in a block pushes its small neighbours down into E4M3's subnormals, or to zero.

Every step decodes the moments to FP32, updates them and the weight in FP32, and encodes the
moments again; the weight update uses the FP32 moments of this step, before they are encoded.
"""
from __future__ import annotations

import torch

from mpcourse.formats import FP8_E4M3

STATE_FORMATS = ("fp32", "bf16", "8bit")
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "8bit": torch.float8_e4m3fn}
MOMENTS = ("exp_avg", "exp_avg_sq")


def quantize_blockwise(x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 codes (the shape of x) and one FP32 scale per block of `block_size` values.

    The flattened tensor is cut into blocks; a last, shorter block is padded with zeros. Each
    block's scale maps its largest magnitude onto E4M3's largest value, 448.
    """
    blocks = _blocks(x.float(), block_size)
    scale = blocks.abs().amax(dim=1).clamp(min=1e-12) / FP8_E4M3.max
    codes = (blocks / scale[:, None]).to(torch.float8_e4m3fn)
    return codes.reshape(-1)[:x.numel()].reshape(x.shape), scale


def dequantize_blockwise(codes: torch.Tensor, scale: torch.Tensor, block_size: int) -> torch.Tensor:
    """The FP32 values that `quantize_blockwise(x, block_size)`'s codes and scales stand for."""
    blocks = _blocks(codes.float(), block_size) * scale[:, None]
    return blocks.reshape(-1)[:codes.numel()].reshape(codes.shape)


def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    flat = x.reshape(-1)
    padding = -flat.numel() % block_size
    if padding:
        flat = torch.cat([flat, flat.new_zeros(padding)])
    return flat.view(-1, block_size)


class AdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) with its moments stored in `state_format`.

    The arithmetic is torch.optim.AdamW's, in FP32 whatever the storage: a 16-bit parameter is
    updated in FP32 and rounded to nearest once, at the end. `state[p]` holds, per moment, a
    tensor in the storage dtype, plus `<moment>_scale` for "8bit".
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, state_format: str = "fp32",
                 block_size: int = 256):
        if state_format not in STATE_FORMATS:
            raise ValueError(f"unknown state_format {state_format!r}; choose one of "
                             f"{', '.join(STATE_FORMATS)}")
        if not (isinstance(block_size, int) and block_size >= 1):
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        if not lr >= 0 or not eps >= 0 or not weight_decay >= 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0, got lr={lr}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        self.state_format = state_format
        self.block_size = block_size
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
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            for name in MOMENTS:
                self._new_moment(state, name, p)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        lr = torch.tensor(group["lr"])
        weight = p.float()
        grad = p.grad.float()
        weight = weight - lr * group["weight_decay"] * weight
        exp_avg = self._read(state, "exp_avg").lerp(grad, 1 - beta1)
        exp_avg_sq = self._read(state, "exp_avg_sq").lerp(grad.square(), 1 - beta2)
        self._write(state, "exp_avg", exp_avg)
        self._write(state, "exp_avg_sq", exp_avg_sq)
        bias_correction1 = 1 - beta1 ** state["step"]
        bias_correction2 = 1 - beta2 ** state["step"]
        denom = exp_avg_sq.sqrt() / bias_correction2.sqrt() + group["eps"]
        p.copy_(weight - lr * (exp_avg / bias_correction1) / denom)

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a `state_dict()`, keeping the moments in this optimizer's storage dtype.

        (torch.optim casts floating-point state to each parameter's dtype on loading; the
        cast to FP32 and back is exact for BF16 and FP8 values.)
        """
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for name in MOMENTS:
                if name in state:
                    state[name] = state[name].to(STATE_DTYPES[self.state_format])

    def _new_moment(self, state: dict, name: str, p: torch.Tensor) -> None:
        state[name] = torch.zeros(p.shape, dtype=STATE_DTYPES[self.state_format], device=p.device)
        if self.state_format == "8bit":
            blocks = -(-p.numel() // self.block_size)
            state[name + "_scale"] = torch.zeros(blocks, device=p.device)

    def _read(self, state: dict, name: str) -> torch.Tensor:
        if name + "_scale" in state:
            return dequantize_blockwise(state[name], state[name + "_scale"], self.block_size)
        return state[name].float()

    def _write(self, state: dict, name: str, value: torch.Tensor) -> None:
        if name + "_scale" in state:
            codes, scale = quantize_blockwise(value, self.block_size)
            state[name].copy_(codes)
            state[name + "_scale"].copy_(scale)
        else:
            state[name].copy_(value)
