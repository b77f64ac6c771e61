"""What one submission's sandbox may use: resources (`Limits`) and time (`Budget`, CPU time of
the whole sandbox with a wall-clock backstop), and the kernel settings its worker computes with."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

WALL_FACTOR = 5.0  # a budget's wall-clock backstop, in multiples of its CPU seconds
POLL = 0.25  # seconds between two readings of a sandbox's CPU time while the grader waits


#: Environment variables that choose torch's kernels and thread counts. Behavioural tests compare
#: the learner's run with the solution's reference run to float tolerance, so both must compute
#: alike: the worker gets the grader's values of these (and nothing else of its environment).
KERNEL_ENVIRONMENT = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                      "ONEDNN_DEFAULT_FPMATH_MODE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                      "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def kernel_environment() -> dict[str, str]:
    """The grader's settings of `KERNEL_ENVIRONMENT`, for a worker to compute as the grader does."""
    return {name: os.environ[name] for name in KERNEL_ENVIRONMENT if name in os.environ}


@dataclass(frozen=True)
class Limits:
    """What one submission's worker may use."""
    memory: int = 6 << 30       # bytes of address space (torch alone maps about 1.5 GiB)
    resident: int = 3 << 30     # bytes of memory its control group may hold, kernel buffers included
    cpu: int = 600              # CPU seconds of any one process, all its threads together
    file_size: int = 64 << 20   # bytes in any one file it writes
    home: int = 256 << 20       # bytes of its home folder, the work folder (in memory)
    tmp: int = 64 << 20         # bytes of its /tmp, and again of its /dev/shm (in memory)
    processes: int = 2048       # processes and threads of the sandbox (its uid, and its control group)
    open_files: int = 1024      # file descriptors per process (each socket or pipe holds kernel buffers)
    output: int = 32 << 20      # bytes printed before the worker is stopped
    reply: int = 16 << 20       # bytes in one reply line, read before any of it is parsed
    reply_items: int = 1 << 20  # JSON items (commas, lists, objects) in one reply line: what parsing builds


class Budget:
    """Time for one stretch of a sandbox's work (its start and cells, one test...): `cpu` seconds
    of CPU time of the sandbox as a whole (every process and thread in it, `setsid` or not), and
    a wall-clock backstop `wall_factor` times larger, counted from now, for a sandbox that waits
    (a `sleep`, a blocked read) instead of computing. `what` names the stretch in reasons.

    CPU time is counted from the moment the budget first applies to a sandbox, per sandbox."""

    def __init__(self, cpu: float, what: str = "", wall_factor: float = WALL_FACTOR):
        self.cpu, self.what, self.wall = float(cpu), what, float(cpu) * wall_factor
        self.wall_end = time.monotonic() + self.wall
        self._start: dict[int, float] = {}

    @classmethod
    def wall_clock(cls, deadline: float) -> Budget:
        """A bare wall-clock deadline (a `time.monotonic()` value), as older callers pass one."""
        budget = cls(math.inf)
        budget.wall, budget.wall_end = max(0.0, deadline - time.monotonic()), deadline
        return budget

    def describe(self) -> str:
        """'a budget of 30 s of CPU time (150 s of wall clock at most)'."""
        if math.isinf(self.cpu):
            return f"a deadline of {self.wall:.0f} s"
        return f"a budget of {self.cpu:g} s of CPU time ({self.wall:.0f} s of wall clock at most)"

    def overrun(self, sandbox) -> str | None:
        """Why this budget is spent for `sandbox` (None while it is not)."""
        used = sandbox.cpu_seconds()
        start = self._start.setdefault(id(sandbox), used)
        if used - start > self.cpu:
            return f"ran past its budget of {self.cpu:g} s of CPU time (an endless loop?)"
        if time.monotonic() >= self.wall_end:
            if math.isinf(self.cpu):
                return f"ran past its deadline of {self.wall:.0f} s"
            return (f"ran past the {self.wall:.0f} s wall-clock backstop of its {self.cpu:g} s CPU budget, "
                    f"having used {used - start:.0f} s of CPU (it waits, or the machine is over "
                    f"{self.wall / self.cpu:g}x busy)")
        return None

    def wait(self) -> float:
        """How long the grader may block before looking at the sandbox's CPU time again."""
        return max(0.0, min(POLL, self.wall_end - time.monotonic()))


def as_budget(deadline: Budget | float) -> Budget:
    return deadline if isinstance(deadline, Budget) else Budget.wall_clock(deadline)
