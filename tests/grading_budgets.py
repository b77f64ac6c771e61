"""Time limits for the grading tests, derived from the grader's own budgets (issue 33).

The grader's budgets are CPU time of each sandbox, with wall-clock backstops `WALL_FACTOR` times
larger; a test waits for a grading run as long as the grader itself would let it run, never a
fixed number of seconds that a busy machine could outrun.
"""
from pathlib import Path

from mpcourse.grading import grader
from mpcourse.grading.judging.exercise import exercise_id, load_exercise
from mpcourse.grading.sandbox.limits import WALL_FACTOR, Budget

ROOT = Path(__file__).resolve().parents[1]


def backstop(paths, timeout: float, jobs: int = 1) -> float:
    """Wall-clock seconds after which `mpcourse grade --timeout TIMEOUT --jobs JOBS PATHS` is
    surely stuck: the grader's own backstops (planning each exercise's solution, then each
    submission's), plus a minute to start and to write its output."""
    options = grader.Options(timeout=timeout)
    solutions = {exercise_id(path.name): load_exercise(path) for path in (ROOT / "solutions").glob("ex*.ipynb")}
    exercises = [solutions.get(exercise_id(Path(p).name)) for p in paths]
    planning = grader.CALIBRATION_SECONDS * options.wall_factor * len({e.name for e in exercises if e})
    return planning + sum(grader.submission_backstop(e, options) for e in exercises) / jobs + 60


def submission_budget(exercise, what: str):
    """The CPU time one submission of `exercise` may use, all its budgets together, as one
    `Budget` (with its wall-clock backstop): for a test that drives a sandbox itself."""
    return Budget(grader.submission_seconds(exercise, grader.Options()), what)


def program_backstop() -> float:
    """Wall-clock seconds for a short Python program a test runs (it imports torch, calls a few
    answers): one grader budget's backstop, `--timeout`'s default times `WALL_FACTOR`."""
    return grader.Options().timeout * WALL_FACTOR


def sandbox_processes(marker: str) -> list[str]:
    """Processes left by submissions, found by a `marker` in their command lines (the `sleep` of
    ex00_detached_process...). Not by uid: other grading runs on the machine have sandboxes too."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:
            pass
    return found
