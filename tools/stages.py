"""Run `make test`'s stages one after the other and print how long each took (`make test`).

Usage: python tools/stages.py STAGE [STAGE ...]   (each a make target: unit, notebooks, ...)

It stops at the first stage that fails, as make would, and prints the table either way, so a
slow or failing stage is seen at the end of the log rather than searched for in it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time


def main(stages: list[str]) -> int:
    if not stages:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    make = os.environ.get("MAKE", "make")
    times, failed = [], None
    for stage in stages:
        start = time.monotonic()
        code = subprocess.call([make, "--no-print-directory", stage])
        times.append((stage, time.monotonic() - start, code))
        if code:
            failed = stage
            break
    total = sum(seconds for _, seconds, _ in times)
    print("\nmake test, stage by stage:")
    for stage, seconds, code in times:
        print(f"  {stage:<14}{seconds:7.0f} s   {'passed' if code == 0 else f'FAILED (exit {code})'}")
    for stage in stages[len(times):]:
        print(f"  {stage:<14}{'':>7}     not run")
    print(f"  {'total':<14}{total:7.0f} s   ({total / 60:.1f} min)")
    if failed:
        print(f"make test: stage '{failed}' failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
