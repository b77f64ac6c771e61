"""What a run reports: after each step (`StepInfo`, for callbacks) and at its end (`RunResult`)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

from mpcourse.train.config import RunConfig


@dataclass(frozen=True)
class StepInfo:
    """What a callback hears after each training step."""
    step: int          # 0-based index of the step just finished
    steps: int         # steps in the run
    loss: float
    seconds: float
    tokens_per_s: float
    scale: float       # the loss scale this step used (1.0 without scaling)
    skipped: bool      # the scaler skipped the optimizer step (a gradient overflowed)


Callback = Callable[[StepInfo], None]


@dataclass
class RunResult:
    """Everything one run measured. Losses are per step, in nats per token."""
    config: RunConfig
    device: str
    accelerated: bool                 # whether the hardware speeds this precision up
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    timed: list[bool] = field(default_factory=list)   # False for warm-up steps
    scales: list[float] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    eval_loss: float = math.nan
    peak_memory_bytes: int = 0
    memory_measured_by: str = ""
    stopped_early: bool = False
    floor: float = math.nan           # the lowest loss any model can reach on the run's data
    measurements: dict = field(default_factory=dict)  # what a variant measured (`RunConfig.measuring`)

    @property
    def steps_done(self) -> int:
        return len(self.losses)

    @property
    def tokens_per_s(self) -> float:
        """Training throughput of a typical step: its tokens over the median timed step (warm-up
        excluded). The median, because other work on the machine can only make a step slower,
        and one stalled step should not set the figure."""
        timed = [s for s, t in zip(self.step_seconds, self.timed) if t]
        if not timed or statistics.median(timed) == 0:
            return math.nan
        return self.config.batch_size * self.config.seq_len / statistics.median(timed)

    def time_to_loss(self, target: float, smooth: int = 10) -> float:
        """Training seconds (warm-up included) until the mean loss of the last `smooth` steps
        first reaches `target`; inf if it never does. Unlike tokens/s, this also charges a
        precision for learning less per step."""
        for end in range(smooth, len(self.losses) + 1):
            if sum(self.losses[end - smooth:end]) / smooth <= target:
                return sum(self.step_seconds[:end])
        return math.inf

    @property
    def final_loss(self) -> float:
        """The mean training loss over the last 10% of the steps (at least one)."""
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail)
