"""The machine a lesson runs on (lesson 00 and every lesson that times something).

- `hardware`: what this machine supports and accelerates (`report`, `mpcourse doctor`);
- `gpus`: the GPU classes learners meet and what their tensor cores run;
- `cpu_profiles`: simulated CPUs, so that a lesson can be checked as another machine would run it;
- `performance`: the roofline of lesson 00 (FLOPs, bytes, tensor-core-friendly shapes);
- `kernel_names`: which profiled GPU kernels are matmuls, and in which precision (lesson 06);
- `benchmark`: honest timing (`measure`, `compare`).
"""
from mpcourse.machine.hardware import HardwareReport, format_report, report, scaled
from mpcourse.machine.performance import (A100_SXM, H100_SXM, Work, elementwise_work, kernels_that_ran,
                                          matmul_work, padded, tensor_core_friendly, tensor_core_multiple)
from mpcourse.machine.benchmark import compare, measure

__all__ = ["HardwareReport", "format_report", "report", "scaled", "A100_SXM", "H100_SXM", "Work",
    "elementwise_work", "kernels_that_ran", "matmul_work", "padded", "tensor_core_friendly",
    "tensor_core_multiple", "compare", "measure"]
