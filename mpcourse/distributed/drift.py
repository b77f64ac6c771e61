"""How far lesson 08's distributed runs may drift from one process, and the size that holds for.

A distributed run differs from one process only by rounding: the order of an FP32 sum, or the
16-bit gradients and parameters a strategy sends and computes with. How far that rounding moves
the loss depends on the model, the learning rate and the number of steps (a small difference
is amplified by every later step), so a bound measured at one size is no bound at another.
`drift_bounds` gives the bounds only for the configuration they were measured at (gloo, two CPU
processes, the lesson's CPU size); for any other it says so, and the lesson checks only what
holds at every size, the order of the runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpcourse.train import RunConfig

#: The size the bounds were measured at: lesson 08's CPU configuration, on two gloo processes.
MEASURED_AT = {"d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 16, "batch_size": 8, "steps": 20,
               "vocab_size": 64, "lr": 1e-2, "precision": "fp32", "loss_scaling": "off", "grad_clip": None}

#: The largest |loss - single-process loss| of each run over its steps, with room for other CPUs.
BOUNDS = {"DDP fp32": 1e-5, "DDP fp16 hook": 1e-3, "DDP bf16 hook": 1e-2,
          "FSDP2 bf16/fp32": 3e-2, "FSDP2 bf16/bf16": 3e-2}


@dataclass(frozen=True)
class DriftBounds:
    """The bounds for a configuration, or None with the reason they do not apply to it."""

    bounds: dict[str, float] | None
    reason: str


def drift_bounds(config: RunConfig) -> DriftBounds:
    """The loss-drift bounds that hold for `config`: `BOUNDS` at the size they were measured at,
    None (and why) at any other size."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"drift_bounds needs a mpcourse.train.RunConfig, got {type(config).__name__}")
    differs = {name: getattr(config, name) for name, value in MEASURED_AT.items()
               if getattr(config, name) != value}
    if not differs:
        return DriftBounds(dict(BOUNDS), "measured at this size (two gloo processes)")
    shown = ", ".join(f"{name} {value}" for name, value in differs.items())
    return DriftBounds(None, f"the bounds were measured at the CPU size (d_model 32, 20 steps); this run "
                             f"has {shown}, where they were never measured, so only the order is checked")
