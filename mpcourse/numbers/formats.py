"""The formats and rounding to them, in one import: `from mpcourse.numbers.formats import BF16, round_to`.

`float_format` defines the formats (`FloatFormat`, FP32 to FP4, `as_format`); `rounding` rounds a
tensor to one (`round_to`) and builds on them, so this module gathers the two for the lessons
and the code that uses both.
"""
from mpcourse.numbers.float_format import (ALL_FORMATS, BF16, E8M0_TORCH_ROUNDS_UP, FORMATS, FP4_E2M1,
                                           FP6_E2M3, FP6_E3M2, FP8_E4M3, FP8_E4M3FNUZ, FP8_E5M2, FP8_E5M2FNUZ,
                                           FP8_E8M0, FP16, FP32, NAN_ENCODINGS, OVERFLOW_MODES,
                                           ROUNDING_MODES, TF32, FloatFormat, as_format)
from mpcourse.numbers.rounding import round_to

__all__ = ["FloatFormat", "as_format", "round_to", "ROUNDING_MODES", "OVERFLOW_MODES", "NAN_ENCODINGS",
           "FP32", "FP16", "BF16", "FP8_E4M3", "FP8_E5M2", "FP8_E4M3FNUZ", "FP8_E5M2FNUZ", "FP8_E8M0",
           "E8M0_TORCH_ROUNDS_UP", "FP6_E2M3", "FP6_E3M2", "FP4_E2M1", "TF32", "FORMATS", "ALL_FORMATS"]
