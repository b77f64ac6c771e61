"""Number formats, bit by bit (lesson 01): what a float of each format can hold, and how a value
rounds to it.

- `float_format`: `FloatFormat`, the formats (FP32, TF32, BF16, FP16, FP8, FP6, FP4, E8M0) and
  `as_format`, which also takes a torch dtype or a name (`torch.bfloat16`, "bf16");
- `rounding`: `round_to`, rounding to a format in integer arithmetic, bit by bit;
- `formats`: both of the above in one import;
- `inspect_value`: one value taken apart (sign, exponent, mantissa, its neighbours);
- `bits_explorer`: the lesson's interactive explorer;
- `precision`: the run precisions' names and dtypes (fp32, tf32, bf16, fp16), one copy for all.
"""
from mpcourse.numbers.float_format import (ALL_FORMATS, BF16, E8M0_TORCH_ROUNDS_UP, FORMATS, FP16, FP32,
                                           FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E4M3FNUZ, FP8_E5M2,
                                           FP8_E5M2FNUZ, FP8_E8M0, TF32, FloatFormat, as_format)
from mpcourse.numbers.rounding import ROUNDING_MODES, round_to
from mpcourse.numbers.inspect_value import bits, explain_value, from_bits, grid, neighbours
from mpcourse.numbers.bits_explorer import BitsExplorer, explorer_text
from mpcourse.numbers.precision import (AUTOCAST_DTYPES, PRECISIONS, RUN_PRECISIONS, PrecisionSupport,
                                        autocast_dtype, short_name)

__all__ = ["ALL_FORMATS", "BF16", "E8M0_TORCH_ROUNDS_UP", "FORMATS", "FP16", "FP32", "FP4_E2M1", "FP6_E2M3",
    "FP6_E3M2", "FP8_E4M3", "FP8_E4M3FNUZ", "FP8_E5M2", "FP8_E5M2FNUZ", "FP8_E8M0", "TF32", "FloatFormat",
    "as_format", "ROUNDING_MODES", "round_to", "bits", "explain_value", "from_bits", "grid", "neighbours",
    "BitsExplorer",
    "explorer_text", "AUTOCAST_DTYPES", "PRECISIONS", "RUN_PRECISIONS", "PrecisionSupport", "autocast_dtype",
    "short_name"]
