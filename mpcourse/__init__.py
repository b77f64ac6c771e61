"""mpcourse: the mechanisms of mixed-precision training, in readable Python.

Modules follow the lessons:

- 01 `formats` (the formats), `rounding` (rounding to them, bit by bit), `inspect_value` (one
  value taken apart), `bits_explorer`;
- 02 `memory` (the accounting), `memory_measure` (measured on the running process);
- 03 `autocast`, with its op tables in `autocast_policy`, and `recipe_step` (one real training
  step of a recipe, each tensor's dtype recorded);
- 04 `master`, and `update_walk` (one weight under many small updates, kept by each cure of
  lessons 04 and 11);
- 05 `scaling`, with its experiments in `scaling_experiments` (lesson 09 repeats two);
- 06 `train` (a package: `RunConfig -> train -> RunResult`, the one training loop, into which
  every variant below plugs through `RunConfig`), `precision` (the run precisions' names and
  dtypes), `lab_size`, `widgets`, on `models` and `data`; tables and plots of results in `views`;
- 07 `fp8`;
- 08 `distributed` (a package: DDP and FSDP2 strategies, collectives, costs, torchrun launch);
- 09 `clinic`, a package with one module of cases per lesson;
- 10 `blockscale`, `scaled_matmul`, `accumulation`, `torch_scaled_mm`, `block_linear`;
- 11 `stochastic`, `kahan`, `codebooks`, `optim_states`, `master_layouts`, `optimizer_memory`,
  `step_memory`, `ladder_measure`.

Around them: `hardware` (what this machine accelerates), `performance` (the roofline of lesson
00), `benchmark`, `course` (the course map) and `grading` (exercises, `check()` and the
sandboxed grader).
"""
__version__ = "0.1.0"

import importlib.util
import sys
import types

#: The public names, each with the module that defines it. They are imported on first use (PEP 562),
#: so that `import mpcourse` and `mpcourse --help` answer at once: most of these modules import
#: torch, which takes seconds to load.
_PUBLIC = {
    "mpcourse.autocast": ("AutocastPolicy", "autocast", "explain_op", "policy_for"),
    "mpcourse.formats": ("BF16", "FP4_E2M1", "FP6_E2M3", "FP6_E3M2", "FP8_E4M3", "FP8_E4M3FNUZ",
                         "FP8_E5M2", "FP8_E5M2FNUZ", "FP8_E8M0", "FP16", "FP32", "TF32", "FloatFormat",
                         "round_to"),
    "mpcourse.inspect_value": ("explain_value",),
    "mpcourse.master": ("MasterWeightOptimizer",),
    "mpcourse.memory": ("MemoryBreakdown", "training_memory", "transformer_memory"),
    "mpcourse.scaling": ("GradScaler", "StaticLossScaler"),
    "mpcourse.train": ("RunConfig", "RunResult"),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
#: The modules `mpcourse.<name>` reaches without an import of its own, as before names were lazy.
_MODULES = ("benchmark", "course", "hardware")

__all__ = [*_MODULES, *_HOME]


def __getattr__(name: str):
    """`mpcourse.BF16`, `mpcourse.hardware`, `mpcourse.formats`: imported when first asked for."""
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


class _Package(types.ModuleType):
    """The package, keeping a public name that a submodule shares (`mpcourse.autocast`, the
    function of `mpcourse/autocast.py`): importing that submodule would otherwise set the name
    to the module, as an eager `from mpcourse.autocast import autocast` here used to undo."""

    def __setattr__(self, name: str, value) -> None:
        if name in _HOME and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
