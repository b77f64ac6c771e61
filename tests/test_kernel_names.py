"""Kernel names as CUDA profiles show them, classified: lesson 06 section 6.3's filter.

The names below are kernel names as torch.profiler and Nsight report them on the GPUs named
(cuBLAS 11 to 12.9, CUTLASS, PyTorch's own kernels), copied from public profiles; the nvjet
ones are cuBLAS's Hopper and Blackwell GEMMs, which lesson 06's old filter (`"gemm" in name`)
missed.
"""
import pytest

from mpcourse.machine.kernel_names import is_matmul_kernel, precision_in_name

MATMULS = {  # name: the precision the name spells out (None: it does not say)
    "volta_sgemm_128x64_tn": "fp32",                                                     # V100, T4
    "ampere_sgemm_128x64_nn": "fp32",                                                    # A100
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn": "bf16",              # A100
    "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn": "fp16",              # A100
    "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn": "fp16",                           # T4
    "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_"
    "tensor16x8x8_kernel": "tf32",                                                       # A100, TF32 on
    "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_"
    "tensor16x8x16_kernel": "bf16",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_"
    "execute_segment_k_off_kernel__5x_cublas": "bf16",                                   # H100
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_"
    "align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8::Params)": "bf16",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": None,                                   # H100
    "nvjet_hsh_256x128_64x4_2x1_v_bz_coopB_TNT": None,                                   # H100
    "nvjet_sm100_tst_64x32_64x16_2x1_2cta_h_bz_splitK_TNT": None,                        # B200
    "nvjet_sm120_tst_mma_64x64x128_3_32x32x128_tmaAB_alignCD4_bz_TNNN": None,            # RTX 50
    "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, "
    "false, false>(cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, "
    "__nv_bfloat16*, float const*, float const*, __nv_bfloat16 const*, float const*, "
    "__nv_bfloat16*, void*, long, float*, int*)": "bf16",
    "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
    "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
    "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
    "float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
    "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
    "float>, float, float)": None,
}
NOT_MATMULS = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::"
    "TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()"
    "#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, "
    "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()"
    "#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, "
    "at::detail::Array<char*, 2>)",
    "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, "
    "4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, "
    "cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(pytorch_flash"
    "::Flash_fwd_params)",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass"
    "::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::"
    "native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
    "Memcpy HtoD (Pageable -> Device)",
    "aten::mm",
]


@pytest.mark.parametrize("name", MATMULS)
def test_every_recorded_gemm_is_a_matmul_with_the_precision_its_name_spells(name):
    assert is_matmul_kernel(name)
    assert precision_in_name(name) == MATMULS[name]


@pytest.mark.parametrize("name", NOT_MATMULS)
def test_attention_elementwise_and_copies_are_not_matmuls(name):
    assert not is_matmul_kernel(name)


def test_the_old_gemm_filter_misses_every_nvjet_gemm():
    nvjet = [name for name in MATMULS if name.startswith("nvjet_")]
    assert len(nvjet) == 4
    assert not any("gemm" in name.lower() for name in nvjet), "what lesson 06 filtered on"
    assert all(is_matmul_kernel(name) for name in nvjet)


def test_bad_input_is_refused_by_name():
    with pytest.raises(TypeError, match="a kernel name is a str, got 3"):
        is_matmul_kernel(3)
    with pytest.raises(ValueError, match="'Memcpy DtoH' is not a matmul kernel"):
        precision_in_name("Memcpy DtoH")
