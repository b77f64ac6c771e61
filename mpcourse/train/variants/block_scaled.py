"""Lesson-06 runs for lesson 10: `OutlierRunConfig` (an outlier feature in any run),
`BlockScaledRunConfig` (block-scaled linears) and `linear_operands` (one layer's operands, captured
from a run). The block-scaled linear itself is `mpcourse.lowbit.linears`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch
from torch import nn

from mpcourse.lowbit.linears import RECIPES_BY_NAME, add_outlier_feature, convert_to_block_scaled
from mpcourse.train.config import RunConfig


@dataclass(frozen=True)
class OutlierRunConfig(RunConfig):
    """A lesson-06 run whose model has an outlier feature of size `outlier_gain` in the input
    of each block's second MLP linear (`add_outlier_feature`); 1.0 means none. Any precision."""
    outlier_gain: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if not (isinstance(self.outlier_gain, (int, float)) and math.isfinite(self.outlier_gain)
                and self.outlier_gain > 0):
            raise ValueError(f"outlier_gain must be a positive finite number, got {self.outlier_gain!r}")

    @property
    def label(self) -> str:
        gain = f", outlier x{self.outlier_gain:g}" if self.outlier_gain != 1.0 else ""
        return f"{super().label}{gain}"

    def prepare_model(self, model: nn.Module) -> nn.Module:
        model = super().prepare_model(model)
        if self.outlier_gain != 1.0:
            add_outlier_feature(model, self.outlier_gain)
        return model


@dataclass(frozen=True)
class BlockScaledRunConfig(OutlierRunConfig):
    """A lesson-06 run whose transformer blocks multiply with block-scaled operands.

    `recipe` names one of `RECIPES_BY_NAME`. `outlier_gain` (from `OutlierRunConfig`) gives the
    model an outlier feature in the widest input (4 x d_model, so that a block of 16 or 32 holds
    a small share of a row); compare with an `OutlierRunConfig` FP32 run of the same gain.
    `keep_blocks` lists transformer blocks (by index; -1 is the last) whose linears stay in high
    precision, as NVIDIA's NVFP4 run kept its first 2 and last 8 of 62 blocks (about 16% of the
    linear layers) in BF16. As in `Fp8RunConfig`, parameters and everything outside the
    converted linears stay FP32 (`precision="fp32"`), with no loss scaling: each block's own
    scale sets its range. Train it with `train.train(BlockScaledRunConfig(...))`.
    """
    recipe: str = "mxfp8"
    keep_blocks: tuple[int, ...] = ()
    loss_scaling: str = "off"

    def __post_init__(self):
        super().__post_init__()
        if self.recipe not in RECIPES_BY_NAME:
            raise ValueError(f"unknown recipe {self.recipe!r}; choose one of "
                             f"{', '.join(RECIPES_BY_NAME)}")
        if self.precision != "fp32" or self.loss_scaling != "off":
            raise ValueError(f"a block-scaled run keeps its other math in fp32 and takes no loss "
                             f"scaling; got precision={self.precision!r}, "
                             f"loss_scaling={self.loss_scaling!r}")
        if any(not -self.n_layers <= b < self.n_layers for b in self.keep_blocks):
            raise ValueError(f"keep_blocks {self.keep_blocks!r} names a block outside the "
                             f"model's {self.n_layers} (indices {-self.n_layers} to {self.n_layers - 1})")

    @property
    def label(self) -> str:
        kept = f", blocks {list(self.keep_blocks)} kept" if self.keep_blocks else ""
        gain = f", outlier x{self.outlier_gain:g}" if self.outlier_gain != 1.0 else ""
        return f"{self.recipe} linears{kept}{gain}"

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """The blocks' linear layers become `BlockScaledLinear`; the tied output head, and the
        linears of `keep_blocks`, stay FP32; then the outlier feature, if any."""
        kept = {f"blocks.{b % self.n_layers}." for b in self.keep_blocks}
        skip = ("head",) + tuple(name for name, m in model.named_modules()
                                 if isinstance(m, nn.Linear) and any(name.startswith(k) for k in kept))
        convert_to_block_scaled(model, RECIPES_BY_NAME[self.recipe], skip=skip, seed=self.seed)
        if self.outlier_gain != 1.0:
            add_outlier_feature(model, self.outlier_gain)
        return model


def linear_operands(config: RunConfig, layer: str) -> dict[str, torch.Tensor]:
    """Train `config` (its plain `RunConfig` switches) through `train.train` and return what
    the linear `layer` (e.g. "blocks.0.mlp.2") multiplied in the last training step: its input
    "activation" and its output "gradient", each as a (tokens, features) matrix, and its "weight".
    These are the tensors a scaling recipe has to quantize."""
    from mpcourse.train.loop import train
    switches = {f.name: getattr(config, f.name) for f in fields(RunConfig)}
    capturing = _CapturingRunConfig(**switches, layer=layer)
    train(capturing)
    return dict(capturing.captured)


@dataclass(frozen=True)
class _CapturingRunConfig(RunConfig):
    """A run that keeps the operands of one linear layer from each training step."""
    layer: str = ""
    captured: dict = field(default_factory=dict, compare=False, repr=False)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        model = super().prepare_model(model)
        module = model.get_submodule(self.layer)
        if not isinstance(module, nn.Linear):
            raise ValueError(f"{self.layer!r} is a {type(module).__name__}, not a linear layer")

        def keep_input(module, inputs, output):
            if torch.is_grad_enabled():   # training steps only, not evaluation
                flat = inputs[0].detach().reshape(-1, module.in_features)
                self.captured.update(activation=flat.float().clone(),
                                     weight=module.weight.detach().float().clone())

        def keep_gradient(module, grad_inputs, grad_outputs):
            flat = grad_outputs[0].detach().reshape(-1, module.out_features)
            self.captured["gradient"] = flat.float().clone()

        module.register_forward_hook(keep_input)
        module.register_full_backward_hook(keep_gradient)
        return model
