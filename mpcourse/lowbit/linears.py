"""Training with block-scaled linears (MXFP8, NVFP4, ...), emulated, through the one loop.

`BlockScaledLinear` quantizes both operands of each of its three matmuls, blocked along the
dimension that matmul reduces over, as MX and NVFP4 training do:

    forward      y      = x  @ W.T     reduces over in_features  (x by rows, W by rows)
    backward     grad_x = g  @ W       reduces over out_features (g by rows, W by columns)
                 grad_W = g.T @ x      reduces over tokens       (g.T and x.T by rows)

A `LinearRecipe` names the scaling of inputs, weights and gradients. With 1-D weight blocks
(1x32, 1x16), W is quantized again, transposed, for grad_x, and the two copies differ. With
square weight blocks (NVFP4's 16x16, DeepSeek-V3's 128x128) one quantized W serves both passes.
NVFP4's recipe adds stochastic rounding of the gradients (`stochastic_gradients`) and a random
Hadamard transform over the tokens of grad_W's two inputs (`hadamard_wgrad`), which spreads
an outlier over 16 values before they share a scale and cancels exactly in the product.

The products are summed in FP32. Emulated: the values are exactly what the low-precision GEMM
would multiply, the speed is not. `BlockScaledRunConfig` (`mpcourse.train.variants.block_scaled`)
trains it through `train.train`, like every variant, keeping in higher precision what the recipes
keep there: embeddings, the output head, norms, attention's softmax and the loss, and optionally
whole blocks (`keep_blocks`).

`add_outlier_feature(model, g)` (which `OutlierRunConfig(outlier_gain=g)` gives any run, FP32 and
BF16 included) makes an outlier feature as large models have them: a fixed gain g on one input
feature of each block's second MLP linear, as a norm's learned gain makes one feature large. The weights are left alone, so the model
itself changes, and every recipe is compared with an FP32 run of the same model.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import nn

from mpcourse.lowbit.blockscale import (BLOCK_128x128, MXFP4, MXFP4_RCEIL, MXFP8_E4M3, MXFP8_E4M3_RCEIL,
                                         NVFP4, NVFP4_16x16, PER_TENSOR, PER_TENSOR_FP4, TILE_1x128,
                                         BlockScaling, check_operand, fake_quantize)
from mpcourse.lowbit.swap import replace_linears, sharing_parameters

#: The layer whose input `OutlierRunConfig.outlier_gain` makes an outlier feature in.
OUTLIER_LAYER = "mlp.2"
#: The input feature that the gain multiplies.
OUTLIER_FEATURE = 0
#: The size of NVFP4's random Hadamard transform (TE's and NVIDIA's paper's choice).
HADAMARD_SIZE = 16


@dataclass(frozen=True)
class LinearRecipe:
    """How a block-scaled linear quantizes its operands: `inputs` (x, for the forward and the
    weight-gradient matmuls), `weights` (W, for forward and input gradient), `gradients` (the
    output gradient g, for both backward matmuls), and NVFP4's two extras."""
    inputs: BlockScaling
    weights: BlockScaling
    gradients: BlockScaling
    stochastic_gradients: bool = False
    hadamard_wgrad: bool = False

    def __post_init__(self) -> None:
        for role in ("inputs", "weights", "gradients"):
            if not isinstance(getattr(self, role), BlockScaling):
                raise TypeError(f"LinearRecipe.{role} must be a BlockScaling, got {getattr(self, role)!r}")


#: The recipes a run can name. "mxfp8" uses the round-up scale rule that TE and cuBLAS compute
#: (Mishra et al. 2025 found the OCP floor rule can diverge); "mxfp8_floor" and "mxfp4_floor"
#: keep the OCP rule; "nvfp4_1d" is NVFP4's format alone, and "nvfp4" NVIDIA's full recipe;
#: per-tensor FP4 is the negative control that block scaling exists to beat.
RECIPES_BY_NAME = {
    "mxfp8": LinearRecipe(MXFP8_E4M3_RCEIL, MXFP8_E4M3_RCEIL, MXFP8_E4M3_RCEIL),
    "mxfp8_floor": LinearRecipe(MXFP8_E4M3, MXFP8_E4M3, MXFP8_E4M3),
    "mxfp4": LinearRecipe(MXFP4_RCEIL, MXFP4_RCEIL, MXFP4_RCEIL),
    "mxfp4_floor": LinearRecipe(MXFP4, MXFP4, MXFP4),
    "deepseek": LinearRecipe(TILE_1x128, BLOCK_128x128, TILE_1x128),
    "nvfp4_1d": LinearRecipe(NVFP4, NVFP4, NVFP4),
    "nvfp4_2d": LinearRecipe(NVFP4, NVFP4_16x16, NVFP4),
    "nvfp4_2d_sr": LinearRecipe(NVFP4, NVFP4_16x16, NVFP4, stochastic_gradients=True),
    "nvfp4": LinearRecipe(NVFP4, NVFP4_16x16, NVFP4, stochastic_gradients=True, hadamard_wgrad=True),
    "per_tensor_e4m3": LinearRecipe(PER_TENSOR, PER_TENSOR, PER_TENSOR),
    "per_tensor_fp4": LinearRecipe(PER_TENSOR_FP4, PER_TENSOR_FP4, PER_TENSOR_FP4),
}


def random_hadamard(size: int = HADAMARD_SIZE, generator: torch.Generator | None = None) -> torch.Tensor:
    """An orthogonal size x size matrix H D / sqrt(size): Sylvester's Hadamard matrix H (entries
    +-1) times a diagonal D of random signs. Multiplying both inputs of a matmul by it along K
    leaves the product unchanged (H D D H.T = size I) and spreads each value over `size`."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"a Hadamard matrix here has a power-of-two size, got {size!r}")
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (size,), generator=generator).float() * 2 - 1
    return h * signs / math.sqrt(size)


def hadamard_along_columns(x: torch.Tensor, transform: torch.Tensor) -> torch.Tensor:
    """x (rows, K) with each stretch of len(transform) columns multiplied by `transform`."""
    size = transform.shape[0]
    if x.shape[1] % size:
        raise ValueError(f"K = {x.shape[1]} is not a multiple of the Hadamard size {size}")
    return (x.reshape(x.shape[0], -1, size) @ transform).reshape(x.shape)


class BlockScaledLinear(nn.Linear):
    """An `nn.Linear` whose three matmuls see block-scaled operands, by `recipe`. `generator`
    draws the stochastic rounding and the Hadamard signs, so that a run can be replayed."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: LinearRecipe = RECIPES_BY_NAME["mxfp8"],
                 generator: torch.Generator | None = None, device=None, dtype=None):
        if not isinstance(recipe, LinearRecipe):
            raise TypeError(f"recipe must be a LinearRecipe, e.g. RECIPES_BY_NAME['mxfp8'] (the names: "
                            f"{', '.join(RECIPES_BY_NAME)}), got {recipe!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = recipe
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "BlockScaledLinear":
        """A BlockScaledLinear sharing `linear`'s parameters."""
        return sharing_parameters(cls, linear, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        y = _BlockScaledMatmul.apply(flat, self.weight, self.recipe, self.generator)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        r = self.recipe
        return (f"{super().extra_repr()}, inputs={r.inputs.name}, weights={r.weights.name}, "
                f"gradients={r.gradients.name}, stochastic_gradients={r.stochastic_gradients}, "
                f"hadamard_wgrad={r.hadamard_wgrad}")


def weight_for_both_passes(weight: torch.Tensor, recipe: BlockScaling) -> tuple[torch.Tensor, torch.Tensor]:
    """(W as the forward matmul reads it, W as the input-gradient matmul reads it), both
    quantized with `recipe`. Square blocks quantize once and use the same values twice; 1-D
    blocks run along in_features for the forward pass, so grad_x needs W quantized again along
    out_features, and its values differ."""
    check_operand(weight, recipe)
    if weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D matrix (out_features x in_features), got shape "
                         f"{tuple(weight.shape)}")
    forward = fake_quantize(weight, recipe)
    if recipe.transposes_exactly:
        return forward, forward
    return forward, fake_quantize(weight.t(), recipe).t()


class _BlockScaledMatmul(torch.autograd.Function):
    """x @ w.T with every operand quantized along the dimension its matmul reduces over."""

    @staticmethod
    def forward(ctx, x, weight, recipe: LinearRecipe, generator: torch.Generator):
        w_forward, w_backward = weight_for_both_passes(weight, recipe.weights)
        ctx.save_for_backward(x, w_backward)
        ctx.recipe, ctx.generator = recipe, generator
        return fake_quantize(x, recipe.inputs) @ w_forward.t()

    @staticmethod
    def backward(ctx, grad_y):
        x, w_backward = ctx.saved_tensors
        recipe, generator = ctx.recipe, ctx.generator
        rounding = (dict(rounding="stochastic", generator=generator)
                    if recipe.stochastic_gradients else {})
        # grad_x = g @ W reduces over out_features: g by rows, W by columns.
        grad_x = fake_quantize(grad_y, recipe.gradients, **rounding) @ w_backward
        # grad_W = g.T @ x reduces over tokens: g.T and x.T by rows (along tokens).
        g_t, x_t = grad_y.t(), x.t()
        if recipe.hadamard_wgrad:
            transform = random_hadamard(HADAMARD_SIZE, generator)
            g_t, x_t = hadamard_along_columns(g_t, transform), hadamard_along_columns(x_t, transform)
        grad_w = fake_quantize(g_t, recipe.gradients, **rounding) @ fake_quantize(x_t, recipe.inputs).t()
        return grad_x, grad_w, None, None


def convert_to_block_scaled(model: nn.Module, recipe: LinearRecipe, *, skip: tuple[str, ...] = ("head",),
                            seed: int = 0) -> list[str]:
    """Replace every `nn.Linear` in `model` (except those named in `skip`) by a
    `BlockScaledLinear` sharing its parameters, each with its own generator seeded from `seed`;
    return the names replaced."""
    count = itertools.count()
    return replace_linears(model, lambda linear: BlockScaledLinear.from_linear(
        linear, recipe=recipe,
        generator=torch.Generator().manual_seed(seed * 1000 + next(count))), skip)


def add_outlier_feature(model: nn.Module, gain: float) -> list[str]:
    """Multiply input feature `OUTLIER_FEATURE` of every block's second MLP linear by `gain`
    (a forward pre-hook, so the linear may be any kind), and return the layers' names. The
    weights are untouched: this is a different model, in which one feature is `gain` times
    larger, as in models whose norm gains grew an outlier feature (LLM.int8, Dettmers et al.
    2022). Gradients flow through the gain by the chain rule."""
    def amplify(module, inputs):
        x = inputs[0]
        gains = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        gains[OUTLIER_FEATURE] = gain
        return (x * gains, *inputs[1:])

    names = [name for name, module in model.named_modules()
             if name.endswith(OUTLIER_LAYER) and isinstance(module, nn.Linear)]
    for name in names:
        model.get_submodule(name).register_forward_pre_hook(amplify)
    return names
