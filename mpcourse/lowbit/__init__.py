"""Below 16 bits (lessons 07 and 10): FP8 with a scale per tensor, then block scaling (MX, NVFP4).

- `fp8`: per-tensor scales (current and delayed), `Fp8Linear` and `convert_to_fp8` (lesson 07);
- `blockscale`: `BlockScaling`, a scale per block of values (MXFP8, MXFP4, NVFP4, ...);
- `matmul`: `scaled_matmul`, a block-scaled matmul with the accumulator of the hardware;
- `torch_mm`: the same through `torch._scaled_mm` where a GPU runs it;
- `accumulation`: the error of a long sum against the accumulation interval;
- `saturation`: how much of a tensor a scale clips;
- `linears`: `BlockScaledLinear`, all three matmuls of a linear layer block-scaled;
- `swap`: putting such linears into a model in place of `nn.Linear`.

The runs that train with them are `mpcourse.train.variants`. `quantize` and `fake_quantize`
exist in both `fp8` and `blockscale`: take them from the module (`mpcourse.lowbit.fp8.quantize`).
"""
from mpcourse.lowbit.fp8 import (BACKENDS, FP8_MIN_CAPABILITY, CurrentScaling, DelayedScaling,
                                 Fp8EmulationWarning, Fp8Linear, amax, choose_backend, compute_scale,
                                 convert_to_fp8, dequantize, fp8_matmul)
from mpcourse.lowbit.blockscale import (AMAX_FLOOR, MXFP4, MXFP4_RCEIL, MXFP8_E4M3, MXFP8_E4M3_RCEIL,
                                        MXFP8_E5M2, NVFP4, PER_ROW, PER_TENSOR, PER_TENSOR_FP4, BlockScaling,
                                        NVFP4_16x16, mx_scale, nvfp4_tensor_scale, snr_db)
from mpcourse.lowbit.matmul import Accumulator, scaled_matmul
from mpcourse.lowbit.torch_mm import layout, runs_on, torch_scaled_mm
from mpcourse.lowbit.accumulation import error_against_k
from mpcourse.lowbit.saturation import clipped_share
from mpcourse.lowbit.linears import (RECIPES_BY_NAME, BlockScaledLinear, LinearRecipe, add_outlier_feature,
                                     convert_to_block_scaled, weight_for_both_passes)
from mpcourse.lowbit.swap import replace_linears, sharing_parameters

__all__ = ["BACKENDS", "FP8_MIN_CAPABILITY", "CurrentScaling", "DelayedScaling", "Fp8EmulationWarning",
    "Fp8Linear", "amax", "choose_backend", "compute_scale", "convert_to_fp8", "dequantize", "fp8_matmul",
    "AMAX_FLOOR", "BlockScaling", "MXFP4", "MXFP4_RCEIL", "MXFP8_E4M3", "MXFP8_E4M3_RCEIL", "MXFP8_E5M2",
    "NVFP4", "NVFP4_16x16", "PER_ROW", "PER_TENSOR", "PER_TENSOR_FP4", "mx_scale", "nvfp4_tensor_scale",
    "snr_db", "Accumulator", "scaled_matmul", "layout", "runs_on", "torch_scaled_mm", "error_against_k",
    "clipped_share", "RECIPES_BY_NAME", "BlockScaledLinear", "LinearRecipe", "add_outlier_feature",
    "convert_to_block_scaled", "weight_for_both_passes", "replace_linears", "sharing_parameters"]
