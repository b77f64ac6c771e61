"""Grading throughput: `mpcourse grade` on 10 copies of the ex00 solution.

Prints each submission's time and submissions per minute, next to the floor that no grader
can beat: starting a fresh kernel and importing torch in it.
"""
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpcourse.grading.grader import _Kernel

ROOT = Path(__file__).resolve().parents[1]
COPIES = 10


def kernel_floor() -> float:
    """Seconds to start one kernel and import torch in it."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        kernel = _Kernel(workdir)
        kernel.run("import torch", time.monotonic() + 120)
        kernel.close()
    return time.perf_counter() - start


def main():
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for i in range(COPIES):
            path = Path(folder) / f"student{i:02d}" / "ex00_bytes.ipynb"
            path.parent.mkdir()
            shutil.copy(ROOT / "solutions" / "ex00_bytes.ipynb", path)
            paths.append(str(path))
        floor = kernel_floor()
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "mpcourse.cli", "grade", *paths], capture_output=True,
                             text=True, cwd=ROOT, check=True).stdout
        wall = time.perf_counter() - start
    print("\n".join(line for line in out.splitlines() if "student" in line and "[" not in line))
    print(f"kernel start-up + import torch (the floor): {floor:.1f} s per submission")
    print(f"{COPIES} submissions graded in {wall:.1f} s wall: {COPIES / wall * 60:.1f} submissions per minute "
          f"({wall / COPIES:.1f} s each, {wall / COPIES / floor:.1f}x the floor)")


if __name__ == "__main__":
    main()
