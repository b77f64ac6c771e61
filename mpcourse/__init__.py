"""mpcourse: the mechanisms of mixed-precision training, in readable Python.

A sub-package per part of the course, each with a front door like torch's (`from mpcourse.amp
import autocast, GradScaler` as `from torch.amp import autocast, GradScaler`), lowest first:

- `numbers` (lesson 01: formats and rounding), `memory` (lesson 02: counted and measured),
  `machine` (lesson 00: what this machine accelerates, the roofline, honest timing);
- `amp` (lessons 03 to 05: autocast, master weights, loss scaling), `lowbit` (lessons 07 and 10:
  FP8 and block scaling), `optim` (lesson 11: optimizers beyond FP32 master weights);
- `train` (lesson 06: `RunConfig -> train -> RunResult`, the model, the data, the lab's size, and
  in `train.variants` the runs that plug the lower parts in), `distributed` (lesson 08), `clinic`
  (lesson 09);
- `views` (tables and plots of results), `grading` (exercises, `check()` and the sandboxed grader).

A part imports only parts on its own level or below (tests/test_package.py holds the order).
Around them: `course` (the course map), `cli` (the `mpcourse` command), `widgets` (the lab's
control panel), `hosted` and `hosted_session` (Colab and Kaggle).
"""
__version__ = "0.1.0"

import importlib
import importlib.util

#: The public names, each with the module that defines it. They are imported on first use (PEP 562),
#: so that `import mpcourse` and `mpcourse --help` answer at once: most of these modules import
#: torch, which takes seconds to load.
_PUBLIC = {
    "mpcourse.amp": ("AutocastPolicy", "GradScaler", "MasterWeightOptimizer", "StaticLossScaler", "autocast",
                     "explain_op", "policy_for"),
    "mpcourse.numbers": ("BF16", "FP4_E2M1", "FP6_E2M3", "FP6_E3M2", "FP8_E4M3", "FP8_E4M3FNUZ", "FP8_E5M2",
                         "FP8_E5M2FNUZ", "FP8_E8M0", "FP16", "FP32", "TF32", "FloatFormat", "explain_value",
                         "round_to"),
    "mpcourse.memory": ("MemoryBreakdown", "training_memory", "transformer_memory"),
    "mpcourse.train": ("RunConfig", "RunResult"),
}
_HOME = {name: package for package, names in _PUBLIC.items() for name in names}
#: The course's parts, each reached as `mpcourse.<part>` without an import of its own.
_PARTS = ("numbers", "memory", "machine", "amp", "lowbit", "optim", "train", "distributed", "clinic", "views",
          "grading")

__all__ = [*_PARTS, *_HOME]


def __getattr__(name: str):
    """`mpcourse.BF16`, `mpcourse.amp`, `mpcourse.course`: imported when first asked for."""
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
