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
would multiply, the speed is not. `BlockScaledRunConfig` trains it through `train.train`, like
every variant, keeping in higher precision what the recipes keep there: embeddings, the output
head, norms, attention's softmax and the loss, and optionally whole blocks (`keep_blocks`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, fields

import torch
from torch import nn

from mpcourse.blockscale import (BLOCK_128x128, MXFP4, MXFP4_RCEIL, MXFP8_E4M3, MXFP8_E4M3_RCEIL,
                                 NVFP4, NVFP4_16x16, PER_TENSOR, PER_TENSOR_FP4, TILE_1x128,
                                 BlockScaling, fake_quantize)
from mpcourse.models import replace_linears, sharing_parameters
from mpcourse.train import RunConfig

#: The layer `BlockScaledRunConfig.outlier_scale` stages its outlier feature in.
OUTLIER_LAYER = "mlp.2"
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
    draws the stochastic rounding and the Hadamard signs, so that a run can be replayed.

    `outlier_scale` s stages an outlier feature, as large models grow them (LLM.int8): the
    matmul multiplies x with input feature 0 times s by W with column 0 divided by s. In exact
    arithmetic that is x @ W.T unchanged (SmoothQuant's equivalence, used in reverse), so the
    model and its FP32 training are the same; only the quantizers see the outlier."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: LinearRecipe = RECIPES_BY_NAME["mxfp8"], outlier_scale: float = 1.0,
                 generator: torch.Generator | None = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = recipe
        self.outlier_scale = outlier_scale
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "BlockScaledLinear":
        """A BlockScaledLinear sharing `linear`'s parameters."""
        return sharing_parameters(cls, linear, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat, weight = x.reshape(-1, self.in_features), self.weight
        if self.outlier_scale != 1.0:
            staged = torch.ones(self.in_features, dtype=flat.dtype, device=flat.device)
            staged[0] = self.outlier_scale
            flat, weight = flat * staged, weight / staged
        y = _BlockScaledMatmul.apply(flat, weight, self.recipe, self.generator)
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


@dataclass(frozen=True)
class BlockScaledRunConfig(RunConfig):
    """A lesson-06 run whose transformer blocks multiply with block-scaled operands.

    `recipe` names one of `RECIPES_BY_NAME`. `outlier_scale` stages an outlier feature (see
    `BlockScaledLinear`) in the input of each block's second MLP linear, the layer with the
    widest input (4 x d_model), so that a block of 16 or 32 holds a small share of it; the FP32
    model is unchanged. 1.0 means none. `keep_blocks` lists transformer blocks (by
    index; -1 is the last) whose linears stay in high precision, as NVIDIA's NVFP4 run kept
    about 15% of its linear layers in BF16. As in `Fp8RunConfig`, parameters and everything
    outside the converted linears stay FP32 (`precision="fp32"`), with no loss scaling: each
    block's own scale sets its range. Train it with `train.train(BlockScaledRunConfig(...))`.
    """
    recipe: str = "mxfp8"
    keep_blocks: tuple[int, ...] = ()
    outlier_scale: float = 1.0
    loss_scaling: str = "off"

    def __post_init__(self):
        super().__post_init__()
        if self.recipe not in RECIPES_BY_NAME:
            raise ValueError(f"unknown recipe {self.recipe!r}; choose one of "
                             f"{', '.join(RECIPES_BY_NAME)}")
        if not (isinstance(self.outlier_scale, (int, float)) and self.outlier_scale > 0):
            raise ValueError(f"outlier_scale must be a positive number, got {self.outlier_scale!r}")
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
        return f"{self.recipe} linears{kept}"

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """The blocks' linear layers become `BlockScaledLinear`; the tied output head, and the
        linears of `keep_blocks`, stay FP32."""
        kept = {f"blocks.{b % self.n_layers}." for b in self.keep_blocks}
        skip = ("head",) + tuple(name for name, m in model.named_modules()
                                 if isinstance(m, nn.Linear) and any(name.startswith(k) for k in kept))
        convert_to_block_scaled(model, RECIPES_BY_NAME[self.recipe], skip=skip, seed=self.seed)
        for name, module in model.named_modules():
            if isinstance(module, BlockScaledLinear) and name.endswith(OUTLIER_LAYER):
                module.outlier_scale = self.outlier_scale
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
