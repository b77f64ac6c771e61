"""Scaling granularities as one mechanism: per tensor, per row, tiles, blocks, MX and NVFP4.

Every recipe for FP8 and FP4 training divides a tensor into blocks, gives each block a scale
from its largest magnitude (its *amax*), stores `x / scale` in the small element format and
multiplies the scale back in after the matmul. The recipes differ only in

- the block shape: the whole tensor (lesson 07), one row, a 1x128 tile or 128x128 block
  (DeepSeek-V3, Transformer Engine's Float8BlockScaling), 32 elements (the OCP MX spec),
  16 elements (NVFP4);
- the scale's own format and rule: an FP32 `amax / element.max` (optionally rounded up to a
  power of two), an E8M0 power of two by the OCP MX spec's floor rule
  `2**(floor(log2(amax)) - emax_elem)` or by the round-up rule (torchao's RCEIL, what cuBLAS
  and Transformer Engine compute) `2**ceil(log2(amax / element.max))`, or NVFP4's E4M3 block
  scale under an FP32 tensor scale `amax_tensor / (448 * 6)`.

So `BlockScaling` describes a recipe and `quantize(x, recipe)` applies any of them. Here a
scale is what a block's elements are *multiplied by* to give back the values (the MX spec's X,
torch._scaled_mm's scale_a), the inverse of lesson 07's `fmt.max / amax`.
Blocks run along the last dimension, the one a matmul reduces over; leading dimensions are rows.
A block may also be square (16x16 for NVFP4 weights, 128x128 for DeepSeek-V3's and TE's): then
the quantized matrix, transposed, is the transpose quantized, so one copy of a weight serves
the forward pass (W) and the input-gradient pass (W.T).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mpcourse.numbers.float_format import (FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E5M2, FP8_E8M0, FP32,
                                           FloatFormat, as_format)
from mpcourse.numbers.rounding import round_to

#: How a block's scale is made from its amax: "amax" (amax / element.max, in FP32 or E4M3),
#: "mx_floor" (the OCP MX v1.0 rule) and "mx_rceil" (E8M0 rounded up; torchao's RCEIL).
SCALE_RULES = ("amax", "mx_floor", "mx_rceil")
MX_RULES = ("mx_floor", "mx_rceil")
#: The smallest amax a current FP32 scale is computed from: an all-zero block would otherwise
#: give a scale of 0 and elements 0/0 = NaN (torchao's per-tensor FP8 path clamps amax to the
#: same 1e-12; the missing clamp was a real FP8 training failure, pytorch/ao issue 3356).
#: NVFP4's tensor scale does not use it: there only amax == 0 is special (as in TE).
AMAX_FLOOR = 1e-12


@dataclass(frozen=True)
class BlockScaling:
    """A scaling recipe: element format, block shape, and how each block's scale is made.

    `block` is (rows, columns) of one block; None means the whole dimension, so (None, None)
    is one scale per tensor and (1, None) one per row. `scale_format` stores the scales
    (FP32, FP8_E8M0 or FP8_E4M3); `rule` is "amax" (scale = amax / element.max, the scale
    rounded to scale_format), "mx_floor" (the MX spec's power of two, which lets amax / X reach
    up to 2**(emax + 1) and clip) or "mx_rceil" (the power of two at or above
    amax / element.max, so nothing clips). `power_of_two` rounds
    FP32 scales up to a power of two (torchao's rowwise recipe, Transformer Engine's block
    recipe), so that dividing by them is exact. `tensor_scale` adds NVFP4's second level: an
    FP32 scale for the whole tensor, under which the block scales are stored in E4M3.
    """
    name: str
    element: FloatFormat
    block: tuple[int | None, int | None]
    scale_format: FloatFormat = FP32
    rule: str = "amax"
    power_of_two: bool = False
    tensor_scale: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "element", as_format(self.element, "element"))
        object.__setattr__(self, "scale_format", as_format(self.scale_format, "scale_format"))
        if not isinstance(self.block, tuple):
            raise TypeError(f"{self.name}: block must be a tuple (rows, columns), got {self.block!r}")
        if self.rule not in SCALE_RULES:
            raise ValueError(f"{self.name}: unknown rule {self.rule!r}; expected one of {SCALE_RULES}")
        if self.scale_format not in (FP32, FP8_E8M0, FP8_E4M3):
            raise ValueError(f"{self.name}: scales are stored in fp32, fp8_e8m0 or fp8_e4m3, "
                             f"got {self.scale_format.name}")
        if (self.rule in MX_RULES) != (self.scale_format == FP8_E8M0):
            raise ValueError(f"{self.name}: the {'/'.join(MX_RULES)} rules go with E8M0 scales "
                             f"and only with them, got rule {self.rule!r}")
        if self.tensor_scale != (self.scale_format == FP8_E4M3):
            raise ValueError(f"{self.name}: E4M3 block scales need an FP32 tensor scale above "
                             f"them (tensor_scale=True), and only they use one")
        if len(self.block) != 2 or any(b is not None and (not isinstance(b, int) or b < 1)
                                       for b in self.block):
            raise ValueError(f"{self.name}: block must be (rows, columns), each a positive "
                             f"integer or None for the whole dimension, got {self.block!r}")

    @property
    def elements_per_scale(self) -> str:
        rows, cols = self.block
        return f"{rows or 'all'} x {cols or 'all'}"

    @property
    def transposes_exactly(self) -> bool:
        """Whether quantizing W.T gives the transpose of quantized W: square blocks, or one
        scale per tensor. Then one quantized weight serves both W and W.T."""
        return self.block[0] == self.block[1]


PER_TENSOR = BlockScaling("per-tensor", FP8_E4M3, (None, None))
PER_ROW = BlockScaling("per-row", FP8_E4M3, (1, None), power_of_two=True)
TILE_1x128 = BlockScaling("1x128 tiles", FP8_E4M3, (1, 128))
BLOCK_128x128 = BlockScaling("128x128 blocks", FP8_E4M3, (128, 128))
MXFP8_E4M3 = BlockScaling("MXFP8 (E4M3)", FP8_E4M3, (1, 32), FP8_E8M0, "mx_floor")
MXFP8_E4M3_RCEIL = BlockScaling("MXFP8 (E4M3, RCEIL)", FP8_E4M3, (1, 32), FP8_E8M0, "mx_rceil")
MXFP8_E5M2 = BlockScaling("MXFP8 (E5M2)", FP8_E5M2, (1, 32), FP8_E8M0, "mx_floor")
MXFP6_E2M3 = BlockScaling("MXFP6 (E2M3)", FP6_E2M3, (1, 32), FP8_E8M0, "mx_floor")
MXFP6_E3M2 = BlockScaling("MXFP6 (E3M2)", FP6_E3M2, (1, 32), FP8_E8M0, "mx_floor")
MXFP4 = BlockScaling("MXFP4", FP4_E2M1, (1, 32), FP8_E8M0, "mx_floor")
MXFP4_RCEIL = BlockScaling("MXFP4 (RCEIL)", FP4_E2M1, (1, 32), FP8_E8M0, "mx_rceil")
NVFP4 = BlockScaling("NVFP4", FP4_E2M1, (1, 16), FP8_E4M3, tensor_scale=True)
NVFP4_16x16 = BlockScaling("NVFP4 16x16", FP4_E2M1, (16, 16), FP8_E4M3, tensor_scale=True)
PER_TENSOR_FP4 = BlockScaling("per-tensor FP4", FP4_E2M1, (None, None))
RECIPES = (PER_TENSOR, PER_ROW, TILE_1x128, BLOCK_128x128, MXFP8_E4M3, MXFP8_E4M3_RCEIL,
           MXFP8_E5M2, MXFP6_E2M3, MXFP6_E3M2, MXFP4, MXFP4_RCEIL, NVFP4, NVFP4_16x16,
           PER_TENSOR_FP4)


@dataclass(frozen=True)
class Quantized:
    """A matrix in a block-scaled format: `elements` (float32 values on the element grid),
    one scale per block (`scales`, shape rows/block_rows x columns/block_columns), and
    NVFP4's `tensor_scale` (1.0 for the others). `dequantize()` gives the values back."""
    elements: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor
    recipe: BlockScaling

    def block_scales(self) -> torch.Tensor:
        """Each element's full scale (block scale times tensor scale), shaped like `elements`."""
        return _per_element(self.scales * self.tensor_scale, self.elements, self.recipe)

    def dequantize(self) -> torch.Tensor:
        return self.elements * self.block_scales()


def mx_scale(amax: torch.Tensor, element: FloatFormat, rule: str = "mx_floor") -> torch.Tensor:
    """A block's E8M0 shared scale X, a power of two, by one of two rules:

    - "mx_floor", the OCP MX v1.0 rule: 2**(floor(log2(amax)) - emax_elem), emax_elem being
      the exponent of the element format's largest normal (8 for E4M3). amax / X lands in
      [2**emax, 2**(emax + 1)), so elements between element.max and 2**(emax + 1) clip
      (448 to 512 for E4M3, 6 to 8 for E2M1).
    - "mx_rceil", round-up (torchao's ScaleCalculationMode.RCEIL, the rule of cuBLAS and
      Transformer Engine): the smallest power of two at or above amax / element.max, computed
      in float32. amax / X never passes element.max, so nothing clips; the cost is that
      amax / X may sit up to a factor of 2 below element.max.

    Exponents are read exactly, subnormal amax included (torch.frexp, not the float32 exponent
    field), and clamped to E8M0's range, 2**-127 to 2**127. An all-zero block gets the smallest
    scale, 2**-127 (any scale would do; an infinite one would not); a block holding inf or NaN
    gets a NaN scale, so the whole block decodes to NaN, as the spec says.
    """
    if rule not in MX_RULES:
        raise ValueError(f"unknown MX scale rule {rule!r}; expected one of {MX_RULES}")
    if not isinstance(amax, torch.Tensor):
        raise TypeError(f"amax must be a tensor of block amaxes, got {type(amax).__name__}")
    element = as_format(element, "element")
    if rule == "mx_floor":
        _, exponent = torch.frexp(amax.float())          # amax = m * 2**exponent, m in [0.5, 1)
        power, positive = exponent - 1 - element.max_exponent, amax > 0
    else:
        quotient = amax.float() / element.max
        mantissa, exponent = torch.frexp(quotient)
        power = exponent - (mantissa == 0.5).int()       # an exact power of two stays
        positive = quotient > 0     # a float32-subnormal amax can underflow the quotient to 0
    power = torch.where(positive, power, -127).clamp(-127, 127)
    scale = torch.ldexp(torch.ones_like(amax, dtype=torch.float32), power)
    return torch.where(amax.isfinite(), scale, torch.full_like(scale, math.nan))


def current_scale(amax: torch.Tensor, recipe: BlockScaling) -> torch.Tensor:
    """The FP32 scale amax / element.max of current scaling, from an amax floored at AMAX_FLOOR,
    rounded up to a power of two when the recipe asks (so that amax / scale stays in range)."""
    scale = amax.float().clamp(min=AMAX_FLOOR) / recipe.element.max
    if recipe.power_of_two:
        mantissa, exponent = torch.frexp(scale)
        scale = torch.ldexp(torch.ones_like(scale), exponent - (mantissa == 0.5).int())
    return scale


def nvfp4_tensor_scale(tensor_amax: torch.Tensor, recipe: BlockScaling = NVFP4) -> torch.Tensor:
    """NVFP4's FP32 tensor scale, amax_tensor / (448 * 6): it maps the tensor's amax to E4M3's
    largest block scale (448) times FP4's largest element (6), so the block scales use E4M3's
    range whatever the tensor's magnitude. Only amax == 0 is special (scale 1, as in
    Transformer Engine): a floor such as 1e-12 would give tiny tensors a tensor scale too large
    for their blocks, which then fall into E4M3's subnormals or to zero. (Below about
    4e-42 the quotient underflows float32; it is kept at float32's smallest subnormal.)"""
    amax = torch.as_tensor(tensor_amax, dtype=torch.float32)
    scale = (amax / (recipe.scale_format.max * recipe.element.max)).clamp(min=2.0**-149)
    return torch.where(amax == 0, torch.ones_like(scale), scale)


def block_amax(x: torch.Tensor, recipe: BlockScaling) -> torch.Tensor:
    """The largest magnitude of each block of 2-D `x` (NaN where a block holds a NaN)."""
    rows, cols = _block_shape(x, recipe)
    blocks = x.detach().float().reshape(x.shape[0] // rows, rows, x.shape[1] // cols, cols)
    return blocks.abs().amax(dim=(1, 3))


def quantize(x: torch.Tensor, recipe: BlockScaling, amax: torch.Tensor | None = None, *,
             rounding: str = "nearest_even", generator: torch.Generator | None = None) -> Quantized:
    """Quantize `x` (2-D, or N-D with the leading dimensions taken as rows) with `recipe`.

    `amax`: each block's amax, when it should not come from `x` itself; lesson 07's delayed
    scaling passes the largest amax of recent steps here. Elements are cast with saturation
    (values past the element format's largest become it), as training kernels do, rounded
    with `rounding` ("stochastic", drawing from `generator`, is NVFP4's rule for gradients).
    """
    check_operand(x, recipe)
    x2 = _as_matrix(x)
    amax = block_amax(x2, recipe) if amax is None else torch.as_tensor(amax, dtype=torch.float32)
    tensor_scale = torch.ones((), dtype=torch.float32)
    if recipe.rule in MX_RULES:
        scales = mx_scale(amax, recipe.element, recipe.rule)
    elif recipe.tensor_scale:
        tensor_scale = nvfp4_tensor_scale(amax.max(), recipe)
        scales = round_to(amax / recipe.element.max / tensor_scale, recipe.scale_format)
    else:
        scales = current_scale(amax, recipe)
    full = _per_element(scales * tensor_scale, x2, recipe)
    # A block scale of 0 (an NVFP4 block far below the tensor's amax) flushes the block to 0.
    scaled = x2.float() / torch.where(full == 0, torch.ones_like(full), full)
    limit = recipe.element.max
    elements = round_to(scaled.clamp(-limit, limit), recipe.element, rounding,
                        generator=generator) * (full != 0)
    return Quantized(elements, scales, tensor_scale, recipe)


def fake_quantize(x: torch.Tensor, recipe: BlockScaling, amax: torch.Tensor | None = None,
                  **rounding) -> torch.Tensor:
    """x quantized with `recipe` and dequantized again: the values a low-precision matmul sees.
    `rounding` and `generator` go to `quantize`."""
    return quantize(x, recipe, amax, **rounding).dequantize().reshape(x.shape).to(x.dtype)


def snr_db(x: torch.Tensor, recipe: BlockScaling, where: torch.Tensor | None = None,
           amax: torch.Tensor | None = None) -> float:
    """The quantization signal-to-noise ratio of `recipe` on `x`, in decibels:
    10 log10(sum x**2 / sum (x - fake_quantize(x))**2). Each 6 dB is about one bit.

    `where` (a boolean mask like x) counts only some elements, though all are quantized: the
    SNR of the ordinary values next to an outlier, which the outlier's energy would hide.
    `amax` goes to `quantize` (delayed scaling)."""
    check_operand(x, recipe)
    x = x.detach().float()
    error = x - fake_quantize(x, recipe, amax)
    if where is not None:
        x, error = x[where], error[where]
    noise = error.double().pow(2).sum().item()
    return 10 * math.log10(x.double().pow(2).sum().item() / max(noise, 1e-300))


def check_operand(x: torch.Tensor, recipe: BlockScaling) -> None:
    """Refuse what no recipe quantizes: `x` not a floating-point tensor of at least one
    dimension (ValueError), or `recipe` not a `BlockScaling` (TypeError)."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() < 1:
        raise ValueError(f"quantize needs a floating-point tensor with at least one dimension, "
                        f"got {x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not isinstance(recipe, BlockScaling):
        raise TypeError(f"recipe must be a BlockScaling such as blockscale.MXFP8_E4M3, got {recipe!r}")


def check_quantized(q: Quantized, name: str) -> None:
    """Refuse an operand that is not a `Quantized` matrix (the result of `quantize`)."""
    if not isinstance(q, Quantized):
        raise TypeError(f"{name} must be a Quantized matrix (blockscale.quantize(x, recipe)), "
                        f"got {type(q).__name__}")


def _as_matrix(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _per_element(scales: torch.Tensor, x: torch.Tensor, recipe: BlockScaling) -> torch.Tensor:
    """One scale per block, spread to one per element of 2-D `x` (a broadcast, not a copy loop)."""
    rows, cols = _block_shape(x, recipe)
    blocks_down, blocks_across = scales.shape
    spread = scales[:, None, :, None].expand(blocks_down, rows, blocks_across, cols)
    return spread.reshape(x.shape)


def _block_shape(x: torch.Tensor, recipe: BlockScaling) -> tuple[int, int]:
    """The block's (rows, columns) for this `x`, after checking that blocks tile it exactly."""
    rows = recipe.block[0] or x.shape[0]
    cols = recipe.block[1] or x.shape[1]
    if x.shape[0] % rows or x.shape[1] % cols:
        raise ValueError(f"{recipe.name}: blocks of {rows}x{cols} don't tile a "
                         f"{x.shape[0]}x{x.shape[1]} tensor; pad it, or pick sizes divisible "
                         f"by the block")
    return rows, cols
