"""The arguments mpcourse hands torch's scaled matmul, checked by torch's own layout checks
(its meta kernel, which validates as for CUDA) and by cuBLAS's documented swizzle; on a GPU
with the kernels, the hardware product against the emulation."""
import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpcourse.blockscale import (BLOCK_128x128, MXFP8_E4M3, MXFP8_E4M3_RCEIL, NVFP4, PER_ROW,
                                 PER_TENSOR, PER_TENSOR_FP4, TILE_1x128, quantize)
from mpcourse.scaled_matmul import scaled_matmul
from mpcourse.torch_scaled_mm import layout, pack_fp4, scaled_mm_arguments, to_blocked, torch_scaled_mm

#: (recipe of a, recipe of b, M, N, K): every layout pair torch 2.13's scaled_mm takes.
PAIRS = [(PER_TENSOR, PER_TENSOR, 32, 48, 64), (PER_ROW, PER_ROW, 32, 48, 64),
         (TILE_1x128, TILE_1x128, 256, 128, 512), (TILE_1x128, BLOCK_128x128, 256, 256, 384),
         (MXFP8_E4M3, MXFP8_E4M3, 64, 96, 256), (MXFP8_E4M3_RCEIL, MXFP8_E4M3_RCEIL, 200, 96, 160),
         (NVFP4, NVFP4, 64, 96, 256)]
IDS = [f"{a.name}-{b.name}" for a, b, *_ in PAIRS]


def operands(recipe_a, recipe_b, m, n, k, device="cpu"):
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m)[:, None]
    b = torch.randn(n, k, generator=g)
    return quantize(a.to(device), recipe_a), quantize(b.to(device), recipe_b)


def on_meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
        return [on_meta(v) for v in value]
    return value


@pytest.mark.parametrize("recipe_a, recipe_b, m, n, k", PAIRS, ids=IDS)
def test_arguments_pass_torchs_own_layout_checks(recipe_a, recipe_b, m, n, k):
    """torch's meta kernel for _scaled_mm_v2 runs the CUDA layout checks (shapes, strides,
    dtypes, swizzle) without a GPU; a wrong layout fails them (checked below)."""
    args = scaled_mm_arguments(*operands(recipe_a, recipe_b, m, n, k))
    out = F.scaled_mm(**{name: on_meta(v) for name, v in args.items()}, output_dtype=torch.bfloat16)
    assert out.shape == (m, n)


def test_a_wrong_layout_fails_torchs_checks():
    a, b = operands(TILE_1x128, TILE_1x128, 256, 128, 512)
    args = scaled_mm_arguments(a, b)
    args["scale_a"] = [a.scales.float().contiguous()]            # row-major: torch wants column-major
    with pytest.raises(RuntimeError, match="1x128 x 1x128 blockwise scaling"):
        F.scaled_mm(**{name: on_meta(v) for name, v in args.items()})
    a, b = operands(MXFP8_E4M3, MXFP8_E4M3, 64, 96, 256)
    args = scaled_mm_arguments(a, b)
    args["scale_a"] = [a.scales.to(torch.float8_e8m0fnu).flatten()]   # not padded and swizzled
    with pytest.raises(RuntimeError, match="for MX scaling scale_a must have"):
        F.scaled_mm(**{name: on_meta(v) for name, v in args.items()})


def test_to_blocked_is_cublas_swizzle():
    """cuBLAS: a tile of 128 rows x 4 scale columns is stored as 32 x 16, the scale of (row r,
    column c) at [r % 32, (r // 32) * 4 + c]; tiles follow one another along the columns."""
    rows, cols = 200, 6
    scales = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) + 1
    blocked = to_blocked(scales)
    col_tiles = 2
    assert blocked.numel() == 256 * 8
    for r in (0, 1, 31, 32, 100, 127, 128, 199):
        for c in (0, 3, 4, 5):
            tile = (r // 128) * col_tiles + c // 4
            offset = tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
            assert blocked[offset] == scales[r, c], (r, c)
    assert (blocked == 0).sum() == 256 * 8 - rows * cols        # the padding is zeros


def test_pack_fp4_gives_the_e2m1_codes_two_per_byte():
    values = torch.tensor([[0.0, 0.5, -1.0, 1.5, 2.0, -3.0, 4.0, 6.0, -0.0, -6.0]])
    packed = pack_fp4(values)
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (1, 5)
    codes = values.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    got = packed.view(torch.uint8).numpy()
    assert (got & 0xF).tolist() == codes[:, 0::2].tolist()       # first of a pair: low nibble
    assert (got >> 4).tolist() == codes[:, 1::2].tolist()
    with pytest.raises(ValueError, match="already on FP4 E2M1's grid"):
        pack_fp4(torch.tensor([[0.7, 1.0]]))


def test_layout_names_what_torch_has_and_rejects_the_rest():
    a, b = operands(NVFP4, NVFP4, 64, 96, 256)
    assert layout(a) == "BlockWise1x16"
    assert layout(quantize(torch.ones(4, 256), TILE_1x128)) == "BlockWise1x128"
    assert layout(quantize(torch.ones(128, 256), BLOCK_128x128)) == "BlockWise128x128"
    with pytest.raises(ValueError, match="no layout for per-tensor FP4"):
        layout(quantize(torch.ones(4, 32), PER_TENSOR_FP4))


def test_tensorwise_and_rowwise_run_on_the_cpu_and_block_layouts_do_not():
    for recipe_a, recipe_b, m, n, k in PAIRS:
        a, b = operands(recipe_a, recipe_b, m, n, k)
        if layout(a) in ("TensorWise", "RowWise"):
            ours, torchs = scaled_matmul(a, b), torch_scaled_mm(a, b)
            assert torch.allclose(ours, torchs, rtol=1e-5, atol=1e-5 * ours.abs().max().item())
        else:   # torch 2.13 has no CPU kernel for block scales: it says so, mpcourse emulates
            with pytest.raises((RuntimeError, ValueError)):
                torch_scaled_mm(a, b)


def _cuda_capability():
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


@pytest.mark.skipif(_cuda_capability() < (9, 0), reason="block-scaled GEMMs need a CUDA GPU, sm_90 or newer")
@pytest.mark.parametrize("recipe_a, recipe_b, m, n, k", PAIRS, ids=IDS)
def test_on_the_gpu_the_hardware_product_matches_the_emulation(recipe_a, recipe_b, m, n, k):
    """Same quantized operands, hardware against emulation: equal up to the BF16 output's
    rounding and FP32 summation order. Layouts this GPU lacks must be refused, not wrong."""
    a, b = operands(recipe_a, recipe_b, m, n, k, device="cuda")
    expected = scaled_matmul(a, b).cpu()
    try:
        got = torch_scaled_mm(a, b, output_dtype=torch.bfloat16).float().cpu()
    except RuntimeError as refused:
        needs_blackwell = layout(a) in ("BlockWise1x32", "BlockWise1x16")
        assert needs_blackwell and _cuda_capability() < (10, 0), refused
        pytest.skip(f"{layout(a)} needs Blackwell: {refused}")
    assert torch.allclose(got, expected, rtol=2.0**-7, atol=1e-3 * expected.abs().max().item())
