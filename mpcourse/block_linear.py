"""Training with block-scaled linears (MXFP8, NVFP4, ...), emulated, through the one loop.

`BlockScaledLinear` quantizes both operands of each of its three matmuls with a `BlockScaling`
recipe, blocked along the dimension that matmul reduces over, as MX and NVFP4 training do:

    forward      y      = x  @ W.T     reduces over in_features  (x and W blocked by rows)
    backward     grad_x = g  @ W       reduces over out_features (g, and W.T, blocked by rows)
                 grad_W = g.T @ x      reduces over tokens       (g.T and x.T blocked by rows)

so each operand is quantized afresh in the layout its matmul reads (a tensor core needs the
scale blocks along K). The products are summed in FP32. Emulated: the values are exactly what
the low-precision GEMM would multiply, the speed is not. Not emulated: NVFP4's stochastic
rounding of gradients and its random Hadamard transform.

`BlockScaledRunConfig` trains it through `train.train`, like every variant, keeping in higher
precision what the recipes keep there: embeddings, the output head, norms, attention's
softmax and the loss (none of them is an `nn.Linear` inside a block, except the head).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
from torch import nn

from mpcourse.blockscale import MXFP4, MXFP8_E4M3, NVFP4, PER_TENSOR, BlockScaling, fake_quantize
from mpcourse.models import replace_linears, sharing_parameters
from mpcourse.train import RunConfig

#: The recipes a run can name: (inputs and weights, output gradients).
RECIPES_BY_NAME = {"mxfp8": (MXFP8_E4M3, MXFP8_E4M3), "nvfp4": (NVFP4, NVFP4),
                   "mxfp4": (MXFP4, MXFP4), "per_tensor_e4m3": (PER_TENSOR, PER_TENSOR)}


class BlockScaledLinear(nn.Linear):
    """An `nn.Linear` whose matmuls see block-scaled operands: `forward_recipe` for inputs and
    weights, `grad_recipe` for output gradients (both blocked along each matmul's K)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 forward_recipe: BlockScaling = MXFP8_E4M3, grad_recipe: BlockScaling | None = None,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.forward_recipe = forward_recipe
        self.grad_recipe = grad_recipe or forward_recipe

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "BlockScaledLinear":
        """A BlockScaledLinear sharing `linear`'s parameters."""
        return sharing_parameters(cls, linear, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        y = _BlockScaledMatmul.apply(flat, self.weight, self.forward_recipe, self.grad_recipe)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, forward={self.forward_recipe.name}, "
                f"grad={self.grad_recipe.name}")


class _BlockScaledMatmul(torch.autograd.Function):
    """x @ w.T with every operand quantized along the dimension its matmul reduces over."""

    @staticmethod
    def forward(ctx, x, weight, forward_recipe: BlockScaling, grad_recipe: BlockScaling):
        ctx.save_for_backward(x, weight)
        ctx.recipes = forward_recipe, grad_recipe
        return fake_quantize(x, forward_recipe) @ fake_quantize(weight, forward_recipe).t()

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        forward_recipe, grad_recipe = ctx.recipes
        # grad_x = g @ W reduces over out_features: g by rows, W.T by rows.
        grad_x = fake_quantize(grad_y, grad_recipe) @ fake_quantize(weight.t(), forward_recipe).t()
        # grad_W = g.T @ x reduces over tokens: g.T and x.T by rows.
        grad_w = fake_quantize(grad_y.t(), grad_recipe) @ fake_quantize(x.t(), forward_recipe).t()
        return grad_x, grad_w, None, None


def convert_to_block_scaled(model: nn.Module, *, skip: tuple[str, ...] = ("head",),
                            **kwargs) -> list[str]:
    """Replace every `nn.Linear` in `model` (except those named in `skip`) by a
    `BlockScaledLinear` sharing its parameters; return the names replaced."""
    return replace_linears(model, lambda linear: BlockScaledLinear.from_linear(linear, **kwargs), skip)


@dataclass(frozen=True)
class BlockScaledRunConfig(RunConfig):
    """A lesson-06 run whose transformer blocks multiply with block-scaled operands.

    `recipe` names one of `RECIPES_BY_NAME`. As in `Fp8RunConfig`, parameters and everything
    outside the blocks' linears stay FP32 (`precision="fp32"`), with no loss scaling: each
    block's own scale sets its range. Train it with `train.train(BlockScaledRunConfig(...))`.
    """
    recipe: str = "mxfp8"
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

    @property
    def label(self) -> str:
        return f"{self.recipe} linears"

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """The blocks' linear layers become `BlockScaledLinear`; the tied output head stays FP32."""
        forward_recipe, grad_recipe = RECIPES_BY_NAME[self.recipe]
        convert_to_block_scaled(model, skip=("head",), forward_recipe=forward_recipe,
                                grad_recipe=grad_recipe)
        return model


def linear_operands(config: RunConfig, layer: str) -> dict[str, torch.Tensor]:
    """Train `config` (its plain `RunConfig` switches) through `train.train` and return what
    the linear `layer` (e.g. "blocks.0.mlp.2") multiplied in the last training step: its input
    "activation" and its output "gradient", each as a (tokens, features) matrix, and its "weight".
    These are the tensors a scaling recipe has to quantize."""
    from mpcourse.train import train
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
