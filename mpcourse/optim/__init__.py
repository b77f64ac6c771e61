"""Optimizers beyond FP32 master weights (lesson 11), as `torch.optim` and torchao hold them.

- `stochastic`: stochastic rounding and an optimizer that keeps BF16 weights with it;
- `kahan`: compensated summation and `KahanOptimizer`;
- `codebooks`: 8-bit blockwise codes (bitsandbytes' dynamic code);
- `optim_states`: `AdamW` with BF16 or 8-bit moments, as torchao keeps them;
- `master_layouts`: `FP32MasterOptimizer`, the master copy the frameworks keep.

The ladder that trains and measures each of them is `mpcourse.train.variants`.
"""
from mpcourse.optim.stochastic import (LowPrecisionWeightOptimizer, StochasticRoundingOptimizer,
                                       stochastic_round)
from mpcourse.optim.kahan import KahanOptimizer, classic_kahan_add, compensated_add, split
from mpcourse.optim.codebooks import dequantize_blockwise, dynamic_code, quantize_blockwise
from mpcourse.optim.optim_states import MIN_8BIT_SIZE, STATE_FORMATS, AdamW
from mpcourse.optim.master_layouts import FP32MasterOptimizer

__all__ = ["LowPrecisionWeightOptimizer", "StochasticRoundingOptimizer", "stochastic_round",
    "KahanOptimizer", "classic_kahan_add", "compensated_add", "split", "dequantize_blockwise",
    "dynamic_code", "quantize_blockwise", "MIN_8BIT_SIZE", "STATE_FORMATS", "AdamW", "FP32MasterOptimizer"]
