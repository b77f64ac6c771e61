"""How long `mpcourse --help` and `import mpcourse` take, each in a new Python, against `import torch`.

The package loads torch (seconds) only when a command or a name needs it (mpcourse/__init__.py,
mpcourse/cli.py), so the help answers at once; the goal is under 1 s. Each command runs `--runs`
times (default 5) in a fresh interpreter, as a learner runs it; printed: the median and the
slowest wall seconds, the median CPU seconds (what the wall time is on an idle core), and whether
torch was loaded. `import torch` is the reference for what a
lazy import saves. Timings depend on this machine's load (printed): they are not a claim about an
idle machine.

    .venv/bin/python benchmarks/bench_cli_help.py [--runs 5]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 1.0
TORCH_LOADED = "import sys; print('torch' in sys.modules)"
COMMANDS = {
    "mpcourse --help": [sys.executable, "-c", "import sys; from mpcourse.cli import main\n"
                        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n" + TORCH_LOADED],
    "import mpcourse": [sys.executable, "-c", "import mpcourse; " + TORCH_LOADED],
    "import torch (reference)": [sys.executable, "-c", "import torch; " + TORCH_LOADED],
}


def timed(command: list[str]) -> tuple[float, float, bool]:
    """Wall and CPU seconds of one run of `command`, and whether it loaded torch (its last line)."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    wall = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return wall, cpu, done.stdout.strip().splitlines()[-1] == "True"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command (default: %(default)s)")
    runs = parser.parse_args().runs
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {runs} runs each, "
          "in a new Python")
    print(f"{'command':<26} {'median s':>9} {'slowest s':>10} {'CPU s':>7}  torch loaded")
    for label, command in COMMANDS.items():
        times, cpus, loaded = zip(*(timed(command) for _ in range(runs)))
        print(f"{label:<26} {statistics.median(times):>9.3f} {max(times):>10.3f} "
              f"{statistics.median(cpus):>7.3f}  {any(loaded)}")
        if label == "mpcourse --help":
            verdict = "within" if statistics.median(times) < GOAL_S else "over"
            print(f"  {verdict} the {GOAL_S:g} s goal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
