"""The course map: every lesson, what it teaches, and what hardware shows it at full size."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lesson:
    number: str
    title: str
    notebook: str
    teaches: str
    full_size_needs: str  # "any", "cuda", "fp8" (an FP8-capable GPU) or "multi-gpu"
    #: What the lesson asks of a learner beyond the earlier lessons and lesson 00's prerequisites.
    also_needs: str = ""


LESSONS = (
    Lesson("00", "Welcome", "00_welcome.ipynb",
           "the course map, your hardware, a first honest measurement and a performance model",
           "any"),
    Lesson("01", "Number formats from the bits", "01_number_formats.ipynb",
           "FP32, FP16, BF16 and FP8 bit by bit; rounding, underflow, overflow", "any"),
    Lesson("02", "Where training memory goes", "02_memory.ipynb",
           "parameters, activations, gradients and optimizer state per layout", "any"),
    Lesson("03", "Autocast from scratch", "03_autocast.ipynb",
           "how autocast picks a precision for each operation", "any",
           also_needs="Python context managers, classes with special methods and threads: it "
                      "builds autocast on torch's TorchFunctionMode and reads torch's dispatcher "
                      "tables (both taught in the lesson)"),
    Lesson("04", "FP32 master weights", "04_master_weights.ipynb",
           "why small updates vanish in 16 bits and how a master copy keeps them", "any"),
    Lesson("05", "Loss scaling", "05_loss_scaling.ipynb",
           "gradient underflow, the dynamic loss scaler and the AMP recipe", "any"),
    Lesson("06", "The mixed-precision training lab", "06_training_lab.ipynb",
           "training a transformer with every precision switch, measured", "cuda"),
    Lesson("07", "FP8 with per-tensor scaling", "07_fp8.ipynb",
           "E4M3 and E5M2, scaling factors and the amax history", "fp8"),
    Lesson("08", "Mixed precision across processes", "08_distributed.ipynb",
           "DDP gradient compression and FSDP2 mixed-precision policies", "multi-gpu",
           also_needs="processes that work together: torchrun, ranks and world size, and what "
                      "the collectives all-reduce, reduce-scatter and all-gather compute"),
    Lesson("09", "The mixed-precision clinic", "09_clinic.ipynb",
           "the failures people hit most, reproduced and fixed", "any"),
    Lesson("10", "Block-scaled FP8 and FP4", "10_block_scaling.ipynb",
           "MX, NVFP4 and DeepSeek-style block scales, every small format bit-exact, "
           "accumulator precision", "fp8"),
    Lesson("11", "Beyond FP32 master weights", "11_beyond_master_weights.ipynb",
           "stochastic rounding, Kahan compensation and 8-bit optimizer states, by the byte", "any"),
)
