"""Grading throughput: `mpcourse grade` on copies of the ex00 solution, sandbox included.

Prints, first, one submission's grading time against the floor no sandboxed grader can beat
(starting a sandboxed worker, which imports torch), measured alternately after a warm-up; then
the throughput of a whole class with `--jobs 2`, against the target of 30 submissions per minute
on an idle 2-core machine. Each submission is graded in a sandbox of its own (its own uid,
control group and seccomp filter) by a grading process of its own, as `mpcourse grade` does. Run
it on an otherwise idle machine: it prints the load average before and after, and other work on
the same cores slows every number (not the scores: the budgets are CPU time). It grades in the
sandbox `mpcourse grade` would choose here, and says which; with a `bwrap` on the PATH that fails
(tests/test_grading_isolation.py's NAMESPACES_REFUSED) it measures the fallback sandbox.

    .venv/bin/python benchmarks/bench_grading.py [COPIES]
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpcourse.machine.benchmark import compare
from mpcourse.grading.judging import judge
from mpcourse.grading.grader import Options, grade_submission, load_exercises
from mpcourse.grading.sandbox.isolation import choose_isolation
from mpcourse.grading.sandbox.limits import Budget, Limits
from mpcourse.grading.sandbox.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[1]
TARGET_PER_MINUTE = 30


def main(copies: int = 20):
    isolation = choose_isolation()
    if not isolation.usable:
        sys.exit(isolation.summary())
    print(isolation.summary())
    exercises = load_exercises(ROOT / "solutions")
    plans = {"ex00": judge.calibrate(exercises["ex00"], Budget(300), Limits())}
    solution = ROOT / "solutions" / "ex00_bytes.ipynb"

    def floor():
        Sandbox(Limits(), Budget(120)).close()

    def one_submission():
        result = grade_submission(solution, exercises, plans, Options())
        assert result.score == result.max_score, result

    print(compare(floor, one_submission, name_a="sandboxed worker start", name_b="one ex00 submission",
                  warmup=1, repeats=5))
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for i in range(copies):
            path = Path(folder) / f"student{i:02d}" / "ex00_bytes.ipynb"
            path.parent.mkdir()
            shutil.copy(solution, path)
            paths.append(str(path))
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mpcourse.cli", "grade", "--jobs", "2", "--json", "--", *paths],
                       capture_output=True, text=True, cwd=ROOT, check=True)
        wall = time.perf_counter() - start
    cores = len(os.sched_getaffinity(0))
    rate = copies / wall * 60
    print(f"{copies} submissions on {cores} cores in {wall:.1f} s wall (the solution's one-off planning "
          f"included): {rate:.1f} per minute, {rate / TARGET_PER_MINUTE:.2f}x the target of "
          f"{TARGET_PER_MINUTE} per minute with --jobs 2; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after (other work slows it)")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
