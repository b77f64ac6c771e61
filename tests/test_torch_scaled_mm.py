"""The arguments mpcourse hands torch's scaled matmul, checked by torch's own layout checks
(its meta kernel, which validates as for CUDA) and by cuBLAS's documented swizzle; on a GPU
with the kernels, the hardware product against the emulation."""
import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpcourse.lowbit.blockscale import (BLOCK_128x128, MXFP8_E4M3, MXFP8_E4M3_RCEIL, NVFP4, PER_ROW,
                                         PER_TENSOR, PER_TENSOR_FP4, TILE_1x128, quantize)
from mpcourse.lowbit.matmul import scaled_matmul
from mpcourse.lowbit.torch_mm import (layout, pack_fp4, runs_on, scaled_mm_arguments, to_blocked,
                                       torch_scaled_mm)

#: torch's CUDA rules for the lists `F.scaled_mm` takes, transcribed from
#: aten/src/ATen/native/cuda/ScaledBlas.cpp of pytorch/pytorch at this commit (the installed torch
#: 2.13 is git cf30153c; its C++ is not installed, and its meta kernel checks only each list's
#: first entry). Per implementation (`scale_kernel_dispatch`): the ScalingTypes of a and of b, how
#: many swizzles each operand must pass (`check_swizzle_lengths`: MXFP8 1, NVFP4 two-level 2;
#: 0 means unchecked), and the first swizzle `_scaled_mxfp8_mxfp8` / `_scaled_nvfp4_nvfp4` demand.
SCALED_BLAS_COMMIT = "0174dfabc023f11a8f78c79c301b49c8d7e02c8b"
SCALED_BLAS_RULES = {
    "tensorwise_tensorwise": (["TensorWise"], ["TensorWise"], 0, None),
    "rowwise_rowwise": (["RowWise"], ["RowWise"], 0, None),
    "block_1x128_128x128": (["BlockWise1x128"], ["BlockWise128x128"], 0, None),
    "block_1x128_1x128": (["BlockWise1x128"], ["BlockWise1x128"], 0, None),
    "mxfp8_mxfp8": (["BlockWise1x32"], ["BlockWise1x32"], 1, "SWIZZLE_32_4_4"),
    "nvfp4_nvfp4": (["BlockWise1x16", "TensorWise"], ["BlockWise1x16", "TensorWise"], 2, "SWIZZLE_32_4_4"),
}
#: Which CUDA capabilities run each implementation, from the same file: `scaled_mm_arch_allowed`
#: (8.9, or 9.0 and newer) for all; `_check_deepseek_support` (major == 9 only) for the 1x128
#: layouts; MX and NVFP4 are not gated by torch, and cuBLAS has their GEMMs from sm_100 on.
CAPABILITIES = [(8, 0), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0)]
RUNS_ON = {"TensorWise": {(8, 9), (9, 0), (10, 0), (10, 3), (12, 0)},
           "RowWise": {(8, 9), (9, 0), (10, 0), (10, 3), (12, 0)},
           "BlockWise1x128": {(9, 0)}, "BlockWise128x128": {(9, 0)},
           "BlockWise1x32": {(10, 0), (10, 3), (12, 0)}, "BlockWise1x16": {(10, 0), (10, 3), (12, 0)}}

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


def _names(values):
    return None if values is None else [v.name for v in values]


def rule_violations(args) -> list[str]:
    """What in `args` (F.scaled_mm's keyword arguments) breaks SCALED_BLAS_RULES: the recipes
    must be one implementation's, with one scale per recipe, and the swizzle lists must have
    the length check_swizzle_lengths wants and the first entry the kernel checks."""
    got = (_names(args["scale_recipe_a"]), _names(args["scale_recipe_b"]))
    matches = [name for name, rule in SCALED_BLAS_RULES.items() if got == (rule[0], rule[1])]
    if len(matches) != 1:
        return [f"{got} is no implementation of ScaledBlas.cpp@{SCALED_BLAS_COMMIT[:8]}"]
    name, (_, _, swizzles, first) = matches[0], SCALED_BLAS_RULES[matches[0]]
    problems = [f"{name}: {len(args[s])} scales for {len(r)} recipes"
                for s, r in (("scale_a", got[0]), ("scale_b", got[1])) if len(args[s]) != len(r)]
    for side in ("swizzle_a", "swizzle_b"):
        listed = _names(args[side]) or []
        if swizzles and len(listed) != swizzles:
            problems.append(f"{name}: {side} must have {swizzles} value(s), got {listed}")
        elif swizzles and listed[0] != first:
            problems.append(f"{name}: {side}[0] must be {first}, got {listed[0]}")
        elif not swizzles and listed:
            problems.append(f"{name} takes no swizzle, got {listed}")
    return problems


@pytest.mark.parametrize("recipe_a, recipe_b, m, n, k", PAIRS, ids=IDS)
def test_argument_lists_follow_torchs_cuda_rules(recipe_a, recipe_b, m, n, k):
    """Each layout's lists against torch's CUDA rules (SCALED_BLAS_RULES)."""
    args = scaled_mm_arguments(*operands(recipe_a, recipe_b, m, n, k))
    assert rule_violations(args) == []
    if layout(operands(recipe_a, recipe_b, m, n, k)[0]) == "BlockWise1x16":
        # torchao 0.18's nvfp4_linear.py: the FP32 tensor scale is not swizzled
        assert _names(args["swizzle_a"])[1] == _names(args["swizzle_b"])[1] == "NO_SWIZZLE"


def test_the_rule_check_catches_a_one_element_nvfp4_swizzle_list():
    """The rule check's positive control: NVFP4 with one swizzle per operand (what this module
    passed before) breaks check_swizzle_lengths, which raises ValueError on a GPU."""
    args = scaled_mm_arguments(*operands(NVFP4, NVFP4, 64, 96, 256))
    args["swizzle_a"], args["swizzle_b"] = args["swizzle_a"][:1], args["swizzle_b"][:1]
    assert rule_violations(args) == [
        "nvfp4_nvfp4: swizzle_a must have 2 value(s), got ['SWIZZLE_32_4_4']",
        "nvfp4_nvfp4: swizzle_b must have 2 value(s), got ['SWIZZLE_32_4_4']"]


@pytest.mark.parametrize("name", sorted(RUNS_ON))
def test_runs_on_says_per_architecture_what_torchs_source_says(name):
    for capability in CAPABILITIES:
        runs, reason = runs_on(name, capability)
        assert runs == (capability in RUNS_ON[name]), (name, capability, reason)
    assert runs_on(name, None)[0] is False
    if name in ("BlockWise1x128", "BlockWise128x128"):
        assert "only supported in CUDA for SM90" in runs_on(name, (10, 0))[1]   # torch's own message
    with pytest.raises(ValueError, match="unknown layout 'BlockWise2x2'"):
        runs_on("BlockWise2x2", (9, 0))


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe_a, recipe_b, m, n, k", PAIRS, ids=IDS)
def test_on_the_gpu_each_layout_runs_where_torchs_source_says_and_matches_the_emulation(
        recipe_a, recipe_b, m, n, k):
    """Same quantized operands, hardware against emulation: equal up to the BF16 output's
    rounding and FP32 summation order, on the architectures RUNS_ON lists. Elsewhere torch
    must refuse (NotImplementedError from its arch checks, ValueError from its argument checks,
    RuntimeError from cuBLAS), never answer."""
    capability = _cuda_capability()
    a, b = operands(recipe_a, recipe_b, m, n, k, device="cuda")
    should_run = capability in RUNS_ON[layout(a)]
    if layout(a) == "BlockWise1x128":   # _check_deepseek_support also wants cuBLASLt 12.9 or newer
        should_run &= tuple(int(p) for p in (torch.version.cuda or "0.0").split(".")[:2]) >= (12, 9)
    try:
        got = torch_scaled_mm(a, b, output_dtype=torch.bfloat16).float().cpu()
    except (RuntimeError, ValueError, NotImplementedError) as refused:
        assert not should_run, f"torch's source runs {layout(a)} on sm_{capability}, but: {refused!r}"
        return
    assert should_run, f"{layout(a)} ran on sm_{capability}, where torch's source refuses it"
    expected = scaled_matmul(a, b).cpu()
    assert torch.allclose(got, expected, rtol=2.0**-7, atol=1e-3 * expected.abs().max().item())
