"""A lesson-06 run whose transformer blocks multiply in FP8 (lesson 07): `Fp8RunConfig`.

The FP8 mechanism itself (scales, `Fp8Linear`, `convert_to_fp8`) is `mpcourse.lowbit.fp8`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mpcourse.lowbit.fp8 import FP8_MIN_CAPABILITY, Fp8Linear, convert_to_fp8
from mpcourse.train.config import RunConfig


@dataclass(frozen=True)
class Fp8RunConfig(RunConfig):
    """A lesson-06 run whose transformer blocks multiply in FP8 (`Fp8Linear`).

    Parameters, LayerNorm, attention scores, the tied embedding/output layer and the loss
    stay FP32 (`precision="fp32"`), as in Transformer Engine, where FP8 covers the linear
    layers of the blocks. FP8 needs no loss scaling: each tensor's own scale sets its range.
    It trains through `train.train`, like every run: `train(Fp8RunConfig(...))`.
    """
    recipe: str = "delayed"
    history_len: int = 16
    margin: int = 0
    backend: str = "auto"

    loss_scaling: str = "off"

    def __post_init__(self):
        super().__post_init__()
        if self.precision != "fp32":
            raise ValueError(f"an FP8 run keeps its non-matmul math and parameters in fp32; "
                             f"got precision={self.precision!r}")
        if self.loss_scaling != "off":
            raise ValueError(f"an FP8 run scales each tensor itself and takes no loss scaling; "
                             f"got loss_scaling={self.loss_scaling!r}, use 'off'")
        Fp8Linear(1, 1, recipe=self.recipe, history_len=self.history_len, margin=self.margin,
                  backend=self.backend, device="meta")  # validates the FP8 switches

    @property
    def label(self) -> str:
        return f"fp8 {self.recipe}-scaling"

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """The blocks' linear layers become `Fp8Linear`; the tied output layer stays FP32."""
        convert_to_fp8(model, skip=("head",), recipe=self.recipe, history_len=self.history_len,
                       margin=self.margin, backend=self.backend)
        return model

    def accelerated(self, device: torch.device, support) -> bool:
        return _fp8_accelerated(device)


def _fp8_accelerated(device: torch.device) -> bool:
    return device.type == "cuda" and tuple(torch.cuda.get_device_capability(device)) >= FP8_MIN_CAPABILITY
