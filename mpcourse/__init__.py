"""mpcourse: the mechanisms of mixed-precision training, in readable Python.

Modules follow the lessons: `formats` (number formats, lesson 01), `memory` (lesson 02),
`autocast` (lesson 03), `master` (lesson 04), `scaling` (lesson 05), `train` (lesson 06).
"""
__version__ = "0.1.0"
from mpcourse import benchmark, course, hardware
from mpcourse.autocast import AutocastPolicy, autocast, explain, policy_for
from mpcourse.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, FloatFormat, round_to
from mpcourse.master import MasterWeightOptimizer
from mpcourse.memory import MemoryBreakdown, training_memory, transformer_memory
from mpcourse.scaling import GradScaler, StaticLossScaler
from mpcourse.train import RunConfig, RunResult

__all__ = [
    "benchmark", "course", "hardware",
    "AutocastPolicy", "autocast", "explain", "policy_for",
    "BF16", "FP8_E4M3", "FP8_E5M2", "FP16", "FP32", "FloatFormat", "round_to",
    "MasterWeightOptimizer",
    "MemoryBreakdown", "training_memory", "transformer_memory",
    "GradScaler", "StaticLossScaler",
    "RunConfig", "RunResult",
]
