"""torch's real scaled matmul, for every block layout torch 2.13 has, fed from `Quantized`.

`torch._scaled_mm` runs TensorWise and RowWise FP8 (also on a CPU, in FP32 arithmetic).
`torch.nn.functional.scaled_mm` adds, on NVIDIA GPUs whose cuBLAS has them:

| `ScalingType` of a and b | recipe here | scales | layout torch expects |
|---|---|---|---|
| BlockWise1x128, BlockWise1x128 | `TILE_1x128` both | FP32 | (rows, K/128), column-major |
| BlockWise1x128, BlockWise128x128 | `TILE_1x128`, `BLOCK_128x128` | FP32 | b: (round_up(K/128, 4), N/128), column-major |
| BlockWise1x32 | MXFP8 (E4M3 elements) | E8M0 | swizzled (`SwizzleType.SWIZZLE_32_4_4`) |
| BlockWise1x16 + TensorWise | NVFP4 | E4M3, and the FP32 tensor scale | swizzled; elements packed two per byte |

Which GPU runs what is `runs_on(layout_name, capability)`, read from torch's CUDA source
(`ScaledBlas.cpp`): every scaled matmul needs sm_89 or sm_90 and newer; the 1x128/128x128
layouts (DeepSeek-V3's recipe) run on sm_90 *only* (`_check_deepseek_support` refuses every
other major version, Blackwell included); MX and NVFP4 are not gated by torch but by cuBLAS,
which has them from Blackwell (sm_100) on. NVFP4 with its FP32 tensor scales is "two-level":
torch's `check_swizzle_lengths` wants two swizzles per operand, one per scale
(`[SWIZZLE_32_4_4, NO_SWIZZLE]`, as torchao 0.18's `nvfp4_linear.py` passes them); MXFP8 one.
`scaled_mm_arguments` builds the arguments from two `Quantized`
(a is M x K, b is N x K, both blocked along K), and `torch_scaled_mm(a, b)` calls torch with
them; it computes a @ b.T. Where the GPU lacks a layout, torch raises and so does this.
The layout follows torch's own checks (`torch/_meta_registrations.py`,
`_check_scaled_mm_sizes_v2`), which the tests run on the meta device, and the swizzle follows
cuBLAS's "1D block scaling factors layout" (torchao's `to_blocked`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mpcourse.lowbit.blockscale import Quantized, check_quantized
from mpcourse.numbers.formats import FP4_E2M1, FP8_E4M3, FP8_E5M2

_ELEMENT_DTYPES = {FP8_E4M3: torch.float8_e4m3fn, FP8_E5M2: torch.float8_e5m2}
#: E2M1's magnitudes in code order: code i (0 to 7) is _FP4_MAGNITUDES[i], bit 3 the sign.
_FP4_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def layout(q: Quantized) -> str:
    """The ScalingType name of `q`'s recipe: TensorWise, RowWise, BlockWise1x128,
    BlockWise128x128, BlockWise1x32 (MX) or BlockWise1x16 (NVFP4); ValueError otherwise."""
    check_quantized(q, "q")
    r = q.recipe
    known = {((None, None), "amax"): "TensorWise", ((1, None), "amax"): "RowWise",
             ((1, 128), "amax"): "BlockWise1x128", ((128, 128), "amax"): "BlockWise128x128",
             ((1, 32), "mx_floor"): "BlockWise1x32", ((1, 32), "mx_rceil"): "BlockWise1x32"}
    if r.tensor_scale and r.block == (1, 16) and r.element == FP4_E2M1:
        return "BlockWise1x16"
    name = known.get((r.block, r.rule))
    if name is None or r.element not in _ELEMENT_DTYPES or r.tensor_scale:
        raise ValueError(f"torch's scaled matmul has no layout for {r.name} "
                         f"({r.elements_per_scale} blocks of {r.element.name}, rule {r.rule})")
    return name


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """cuBLAS's swizzled layout of block scales (rows x K/block), flattened: tiles of 128 rows
    x 4 scale columns, zero-padded, each stored as 32 x 16 (rows i, i+32, i+64, i+96 side by
    side). What MX and NVFP4 GEMMs read (SwizzleType.SWIZZLE_32_4_4)."""
    rows, cols = scales.shape
    row_tiles, col_tiles = -(-rows // 128), -(-cols // 4)
    padded = scales.new_zeros(row_tiles * 128, col_tiles * 4)
    padded[:rows, :cols] = scales
    tiles = padded.view(row_tiles, 128, col_tiles, 4).permute(0, 2, 1, 3)
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16).flatten()


def pack_fp4(elements: torch.Tensor) -> torch.Tensor:
    """FP4 E2M1 values (float32, on the grid) as torch.float4_e2m1fn_x2, two per byte, the
    first of each pair in the low nibble (torchao's pack_uint4). Torch has no FP4 cast."""
    magnitude = elements.abs()
    codes = torch.bucketize(magnitude, _FP4_MAGNITUDES.to(elements.device))
    if not torch.equal(_FP4_MAGNITUDES.to(elements.device)[codes.clamp(max=7)], magnitude):
        raise ValueError("pack_fp4 takes values already on FP4 E2M1's grid")
    codes = (codes | (elements.signbit().long() << 3)).to(torch.uint8)
    pairs = codes.reshape(*elements.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).view(torch.float4_e2m1fn_x2)


def _column_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


def scaled_mm_arguments(a: Quantized, b: Quantized) -> dict:
    """The keyword arguments of torch.nn.functional.scaled_mm for a @ b.T, on the operands'
    device: mat_a (M x K, row-major), mat_b (K x N, column-major), each scale in the layout
    torch checks for, the ScalingType and SwizzleType of each."""
    kind_a, kind_b = layout(a), layout(b)
    pairs = {("TensorWise", "TensorWise"), ("RowWise", "RowWise"), ("BlockWise1x128", "BlockWise1x128"),
             ("BlockWise1x128", "BlockWise128x128"), ("BlockWise1x32", "BlockWise1x32"),
             ("BlockWise1x16", "BlockWise1x16")}
    if (kind_a, kind_b) not in pairs:
        raise ValueError(f"torch's scaled matmul does not pair {kind_a} (a) with {kind_b} (b)")
    if kind_a == "BlockWise1x16":
        mat_a, mat_b = pack_fp4(a.elements), pack_fp4(b.elements).t()
    else:
        mat_a = a.elements.to(_ELEMENT_DTYPES[a.recipe.element]).contiguous()
        mat_b = b.elements.to(_ELEMENT_DTYPES[b.recipe.element]).contiguous().t()
    swizzle = None
    if kind_a == "TensorWise":
        scale_a, scale_b = a.scales.float().reshape(()), b.scales.float().reshape(())
    elif kind_a == "RowWise":
        scale_a, scale_b = a.scales.float().reshape(-1, 1), b.scales.float().reshape(1, -1)
    elif kind_a == "BlockWise1x128":
        scale_a = _column_major(a.scales.float())
        if kind_b == "BlockWise1x128":
            scale_b = _column_major(b.scales.float())
        else:   # (N/128, K/128) padded along K to a multiple of 4, read as (L4, N/128)
            blocks_n, blocks_k = b.scales.shape
            padded = b.scales.new_zeros(blocks_n, -(-blocks_k // 4) * 4, dtype=torch.float32)
            padded[:, :blocks_k] = b.scales
            scale_b = padded.t()
    else:
        scale_dtype = torch.float8_e8m0fnu if kind_a == "BlockWise1x32" else torch.float8_e4m3fn
        scale_a = to_blocked(a.scales.to(scale_dtype))
        scale_b = to_blocked(b.scales.to(scale_dtype))
        swizzle = [F.SwizzleType.SWIZZLE_32_4_4]
        if kind_a == "BlockWise1x16":   # one swizzle per scale; the FP32 tensor scale's is none
            swizzle.append(F.SwizzleType.NO_SWIZZLE)
    recipe_a, recipe_b = [getattr(F.ScalingType, kind_a)], [getattr(F.ScalingType, kind_b)]
    scale_a, scale_b = [scale_a], [scale_b]
    if kind_a == "BlockWise1x16":   # NVFP4's second level: the FP32 tensor scales
        scale_a.append(a.tensor_scale.float().reshape(()))
        scale_b.append(b.tensor_scale.float().reshape(()))
        recipe_a.append(F.ScalingType.TensorWise)
        recipe_b.append(F.ScalingType.TensorWise)
    return dict(mat_a=mat_a, mat_b=mat_b, scale_a=scale_a, scale_recipe_a=recipe_a,
                scale_b=scale_b, scale_recipe_b=recipe_b, swizzle_a=swizzle,
                swizzle_b=None if swizzle is None else list(swizzle))


#: Where torch 2.13's CUDA scaled matmul runs each layout, and why not elsewhere, as its
#: source says (aten/src/ATen/native/cuda/ScaledBlas.cpp: `scaled_mm_arch_allowed`,
#: `_check_deepseek_support`; MX and NVFP4 are left to cuBLAS, whose block-scaled GEMMs
#: start at sm_100). Keys: layout names; values: (a test on (major, minor), the reason).
GPU_SUPPORT = {
    "TensorWise": (lambda cc: cc >= (9, 0) or cc == (8, 9),
                   "torch._scaled_mm needs compute capability 8.9, or 9.0 and newer"),
    "RowWise": (lambda cc: cc >= (9, 0) or cc == (8, 9),
                "torch._scaled_mm needs compute capability 8.9, or 9.0 and newer"),
    "BlockWise1x128": (lambda cc: cc[0] == 9,
                       "DeepSeek style (1x128, 128x128) scaling only supported in CUDA for SM90"
                       " (and with cuBLASLt 12.9 or newer)"),
    "BlockWise1x32": (lambda cc: cc[0] >= 10,
                      "MX block scaling needs cuBLAS's block-scaled GEMMs, sm_100 (Blackwell) and newer"),
    "BlockWise1x16": (lambda cc: cc[0] >= 10,
                      "NVFP4 block scaling needs cuBLAS's block-scaled GEMMs, sm_100 (Blackwell) and newer"),
}


def runs_on(layout_name: str, capability: tuple[int, int] | None) -> tuple[bool, str]:
    """(whether torch's scaled matmul runs `layout_name` on a CUDA GPU of `capability`, the
    reason); None means no CUDA GPU. BlockWise128x128 pairs with BlockWise1x128 and shares its
    rule."""
    rule = GPU_SUPPORT.get("BlockWise1x128" if layout_name == "BlockWise128x128" else layout_name)
    if rule is None:
        raise ValueError(f"unknown layout {layout_name!r}; choose one of {', '.join(GPU_SUPPORT)}, "
                         "BlockWise128x128")
    if capability is None:
        return False, "no CUDA GPU"
    test, reason = rule
    return bool(test(tuple(capability))), reason


def torch_scaled_mm(a: Quantized, b: Quantized, output_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """a @ b.T through torch's own scaled matmul, on the operands' device. TensorWise and
    RowWise go through `torch._scaled_mm` (which also runs on a CPU); block layouts through
    `torch.nn.functional.scaled_mm`, which needs a GPU that has them (cuBLAS rejects the rest,
    and torch 2.13 has no CPU kernel for them). MX and NVFP4 kernels may insist on a BF16
    output: pass output_dtype=torch.bfloat16 there."""
    check_quantized(a, "a"), check_quantized(b, "b")
    args = scaled_mm_arguments(a, b)
    if args["scale_recipe_a"][0] in (F.ScalingType.TensorWise, F.ScalingType.RowWise):
        return torch._scaled_mm(args["mat_a"], args["mat_b"], scale_a=args["scale_a"][0],
                                scale_b=args["scale_b"][0], out_dtype=output_dtype)
    return F.scaled_mm(**args, output_dtype=output_dtype)
