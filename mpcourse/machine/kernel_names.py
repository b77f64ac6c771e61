"""What a CUDA kernel's name says about a matmul: whether it is one, and the precision it ran in.

`performance.kernels_that_ran` lists the CUDA kernels a function launched. Their names are the
libraries' own and change with the GPU and the library version. Up to Ampere, cuBLAS's GEMMs
spell out "gemm" and, mostly, the input type (`ampere_bf16_s16816gemm_...`, `sm80_xmma_gemm_
f32f32_tf32f32_...`, `volta_sgemm_...`). From Hopper on, cuBLAS picks most GEMMs from its
`nvjet` family (`nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT`), whose names hold no "gemm" and
no spelled-out input type: a filter on "gemm" misses them and reports no matmul at all. The
input dtypes of the `aten::mm` that launched them are the reliable witness; the names are not.
"""
from __future__ import annotations

import re

# Attention kernels first: FlashAttention's and the memory-efficient kernels' names can hold
# "cutlass" or "gemm" fragments, and they are not the matmuls of a linear layer.
_ATTENTION = re.compile(r"flash|fmha|attention|attn", re.IGNORECASE)
# cuBLAS and CUTLASS GEMMs (gemm, sgemm, hgemm, xmma_gemm), matrix-vector kernels (gemv, gemvx),
# cuBLAS's Hopper/Blackwell family (nvjet_), and the split-K reduction a GEMM may end with.
_MATMUL = re.compile(r"gemm|gemv|nvjet_|splitkreduce", re.IGNORECASE)
# What a name spells out, checked in this order: an FP32 GEMM with TF32 inputs names "f32"
# too, and an FP8 GEMM may name its bf16 output.
_PRECISION_MARKS = (("e4m3", "fp8"), ("e5m2", "fp8"), ("tf32", "tf32"), ("bf16", "bf16"),
                    ("bfloat16", "bf16"), ("fp16", "fp16"), ("hgemm", "fp16"), ("sgemm", "fp32"))


def is_matmul_kernel(name: str) -> bool:
    """Whether the CUDA kernel `name` is a matrix multiplication (cuBLAS, cuBLASLt or CUTLASS)."""
    if not isinstance(name, str):
        raise TypeError(f"a kernel name is a str, got {name!r} ({type(name).__name__})")
    return bool(_MATMUL.search(name)) and not _ATTENTION.search(name)


def precision_in_name(name: str) -> str | None:
    """The precision a matmul kernel's name spells out ("fp8", "tf32", "bf16", "fp16" or
    "fp32"), or None where it does not (the nvjet family, most gemv kernels): then read the
    input dtypes of the `aten::` op that launched it."""
    if not is_matmul_kernel(name):
        raise ValueError(f"{name!r} is not a matmul kernel: only GEMM, GEMV and nvjet names "
                         "say a matmul's precision")
    lowered = name.lower()
    return next((precision for mark, precision in _PRECISION_MARKS if mark in lowered), None)
