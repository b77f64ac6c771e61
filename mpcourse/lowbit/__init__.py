"""Below 16 bits (lessons 07 and 10): FP8 with a scale per tensor, then block scaling (MX, NVFP4).

- `fp8`: per-tensor scales (current and delayed), `Fp8Linear` and `convert_to_fp8` (lesson 07);
- `blockscale`: `BlockScaling`, a scale per block of values (MXFP8, MXFP4, NVFP4, ...);
- `matmul`: `scaled_matmul`, a block-scaled matmul with the accumulator of the hardware;
- `torch_mm`: the same through `torch._scaled_mm` where a GPU runs it;
- `accumulation`: the error of a long sum against the accumulation interval;
- `saturation`: how much of a tensor a scale clips;
- `linears`: `BlockScaledLinear`, all three matmuls of a linear layer block-scaled;
- `swap`: putting such linears into a model in place of `nn.Linear`.

This front door hands on the names that lessons 07 and 10 and exercise 10 take from it, each with
one meaning. Everything else comes from its module, by its full path:
`from mpcourse.lowbit.fp8 import quantize` (FP8 with one scale) is not
`from mpcourse.lowbit.blockscale import quantize` (a scale per block). The runs that train with
them are `mpcourse.train.variants`.
"""
from mpcourse.lowbit.fp8 import choose_backend
from mpcourse.lowbit.matmul import Accumulator, scaled_matmul
from mpcourse.lowbit.torch_mm import layout, runs_on, torch_scaled_mm
from mpcourse.lowbit.accumulation import error_against_k
from mpcourse.lowbit.saturation import clipped_share
from mpcourse.lowbit.linears import RECIPES_BY_NAME, weight_for_both_passes

__all__ = ["choose_backend", "Accumulator", "scaled_matmul", "layout", "runs_on", "torch_scaled_mm",
           "error_against_k", "clipped_share", "RECIPES_BY_NAME", "weight_for_both_passes"]
