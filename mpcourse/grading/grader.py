"""Grading one submission, and a class in the grading pool, treating every submission as hostile.

For each submission:
1. The exercise comes from the file name; the tests, hidden ones included, from the solution
   notebook, read before any submission runs. Metadata naming another exercise is reported.
   A path that leads into the solutions folder (through a link anywhere in it) is refused.
2. The submission's code cells run in a fresh worker inside a sandbox (`sandbox`: bubblewrap, or
   an unprivileged user where namespaces are refused). A cell that kills its process is skipped
   and the worker restarted, as a learner would restart a kernel, with a fresh time budget.
3. Each test runs here, with the learner's functions called through the sandbox on data
   (`judge`): no test code enters the sandbox, and the verdict is computed in this process. Each
   test has its own time budget: a test that runs out fails alone, and the points earned before
   it stay. Budgets are CPU time of the sandbox (`limits.Budget`), `--timeout` seconds for the
   cells at each start and again for each test, with a wall-clock backstop `WALL_FACTOR` times
   larger: a busy machine slows grading down without turning honest work into a timeout.
4. Whatever happens, the submission gets a score and a one-line reason, and grading goes on.
   Each submission is graded in a process of its own, with its own memory and time limit
   (`pool`); one that cannot be graded is reported, and the exit status says so. The gradebook
   is written atomically at the end (`gradebook`).
"""
from __future__ import annotations

import contextlib
import resource
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat

from mpcourse.grading.judging import judge
from mpcourse.grading.judging.exercise import (Exercise, exercise_id, find_solutions, learner_cells,
                                                load_exercise)
from mpcourse.grading.gradebook import SubmissionResult
from mpcourse.grading.sandbox.pool import OutOfTime, grade_in_processes
from mpcourse.grading.sandbox.isolation import USER, choose_isolation
from mpcourse.grading.sandbox.limits import WALL_FACTOR, Budget, Limits
from mpcourse.grading.sandbox.sandbox import RequestFailed, Sandbox, WorkerGone
from mpcourse.grading.judging.selfcheck import TestResult
from mpcourse.grading.judging.verdict import first_line

MAX_RESTARTS = 3
CALIBRATION_SECONDS = 300.0  # CPU seconds for running a solution to plan its tests
MAX_NOTEBOOK_BYTES = 50 << 20
UNSAFE_NOTE = ("graded WITHOUT a sandbox (--unsafe-no-sandbox): the submission could read and change "
               "files, other submissions and this gradebook")
FALLBACK_NOTE = ("graded in the fallback sandbox (an unprivileged user, no namespaces: bubblewrap cannot "
                 "run here); see `mpcourse grade`'s first line for what it does not isolate")



@dataclass(frozen=True)
class Options:
    timeout: float = 120.0               # CPU seconds for the notebook's cells per start, and again per test
    wall_factor: float = WALL_FACTOR     # each budget's wall-clock backstop, in multiples of its CPU seconds
    sandboxed: bool = True
    limits: Limits = Limits()
    solutions: Path | None = None        # resolved once; no submission may lie inside it
    grader_memory: int = 3 << 30         # bytes of address space a grading process may add to the grader's


def submission_seconds(exercise: Exercise | None, options: Options) -> float:
    """The most CPU time one submission's sandboxes may use, all budgets together: its cells once
    per start (the first and up to MAX_RESTARTS more), the setup, and each test. INSTRUCTORS.md
    ("Time") states this bound."""
    tests = len(exercise.tests) if exercise else 0
    return options.timeout * (tests + 2 + MAX_RESTARTS)


def submission_backstop(exercise: Exercise | None, options: Options) -> float:
    """Wall-clock seconds after which a submission's grading process is stopped, whatever it is
    doing: `wall_factor` times its CPU bound, and a minute for its own work."""
    return submission_seconds(exercise, options) * options.wall_factor + 60


class SubmissionFailed(Exception):
    """The submission as a whole could not be graded; the message is the one-line reason."""


def grade_submission(path, exercises: dict[str, Exercise], plans: dict,
                     options: Options = Options()) -> SubmissionResult:
    """Score one submitted notebook against the tests of its exercise; never raises."""
    start = time.perf_counter()
    path = Path(path)
    exercise, verdicts, error, notes, graded = exercises.get(exercise_id(path.name) or ""), {}, None, [], True
    if not options.sandboxed:
        notes.append(UNSAFE_NOTE)
    elif choose_isolation().kind == USER:
        notes.append(FALLBACK_NOTE)
    try:
        _refuse_solutions(path, options)
        if exercise is None:
            raise SubmissionFailed(f"cannot tell which exercise this is: {path.name!r} does not start with a "
                                   f"known exercise id (known: {', '.join(sorted(exercises)) or 'none'})")
        nb = _read_submission(path, notes)
        course = nb.metadata.get("mpcourse")
        claimed = course.get("exercise") if isinstance(course, dict) else None
        if claimed is not None and claimed != exercise.name:
            notes.append(f"the notebook's metadata says exercise {str(claimed)[:60]!r}; graded as "
                         f"{exercise.name}, from the file name")
        plan = plans.get(exercise_id(path.name))
        if not isinstance(plan, judge.Plan):
            raise SubmissionFailed(f"the solution of {exercise.name} could not be run to plan its tests: "
                                   f"{plan}")
        error = _grade(nb, exercise, plan, options, notes, verdicts)
    except SubmissionFailed as failure:
        error = str(failure)
    except OutOfTime:
        error = (f"timed out: grading this submission ran past its wall-clock backstop of "
                 f"{submission_backstop(exercise, options):.0f} s ({options.wall_factor:g} x the "
                 f"{submission_seconds(exercise, options):g} s of CPU time its budgets add up to, and a "
                 f"minute)")
    except Exception as failure:  # a bug here must cost this submission only, not the run
        error, graded = f"grading failed: {type(failure).__name__}: {first_line(failure, 200)}", False
    tests = [TestResult(t.id, t.points if verdicts[t.id][0] else 0.0, t.points, verdicts[t.id][0],
                        None if verdicts[t.id][0] else first_line(verdicts[t.id][1] or "failed", 300))
             if t.id in verdicts else TestResult(t.id, 0.0, t.points, False, error)
             for t in (exercise.tests if exercise else ())]
    return SubmissionResult(path=str(path), exercise=exercise.name if exercise else None,
                            score=sum(t.points for t in tests),
                            max_score=exercise.max_score if exercise else 0.0, error=error, tests=tests,
                            seconds=time.perf_counter() - start, notes=notes, graded=graded)


def _refuse_solutions(path: Path, options: Options):
    """A submission that is, or leads through links to, a file in the solutions folder is
    refused, and so is a hard link to one of its files (same device and inode)."""
    if options.solutions is None:
        return
    if path.resolve().is_relative_to(options.solutions):
        raise SubmissionFailed(f"refused: this path leads into the solutions folder "
                               f"{str(options.solutions)!r}")
    try:
        found = path.stat()
    except OSError:
        return  # reading it says what is wrong
    if any(found.st_ino == known.st_ino and found.st_dev == known.st_dev
           for known in map(Path.stat, options.solutions.glob("*.ipynb"))):
        raise SubmissionFailed(f"refused: this file is a solution of {str(options.solutions)!r} "
                               "(a hard link)")


def _read_submission(path: Path, notes: list) -> nbformat.NotebookNode:
    """The notebook, if `path` is a regular file (a link could point at a solution) of sane size.
    One that Jupyter opens but the nbformat schema rejects is graded, with a note saying so."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise SubmissionFailed(f"not a regular file (a link or a folder): {path}")
    if path.exists() and path.stat().st_size > MAX_NOTEBOOK_BYTES:
        raise SubmissionFailed(f"{path.stat().st_size:,} bytes: larger than the {MAX_NOTEBOOK_BYTES >> 20} "
                               "MiB a submitted notebook may have")
    try:
        with warnings.catch_warnings():  # old notebooks without cell ids are still fine to grade
            warnings.simplefilter("ignore")
            nb = nbformat.read(path, as_version=4)
    except FileNotFoundError:
        raise SubmissionFailed(f"file not found: {path}") from None
    except Exception as error:
        raise SubmissionFailed(f"not a valid .ipynb notebook: {first_line(error, 200)}") from None
    try:
        nbformat.validate(nb)
    except Exception as error:  # noqa: BLE001: any schema complaint is only a note
        notes.append(f"graded although the notebook breaks the nbformat schema: {first_line(error, 100)!r}")
    return nb


def _grade(nb, exercise: Exercise, plan: judge.Plan, options: Options, notes: list,
           verdicts: dict) -> str | None:
    """Fill `verdicts` (test id -> (passed, reason)) test by test; return the first cell error.
    The learner's cells run in the sandbox; every test runs here, calling the learner's functions
    through it (`judge`). On a timeout or a failure, the verdicts already filled stay."""
    with NotebookRunner(learner_cells(nb, exercise), options, notes, exercise.write_yourself) as runner:
        runner.begin_test("the setup")  # the setup's own time, as a test's
        namespace, proxies = judge.grader_namespace(exercise, runner.request)
        for test in exercise.tests:
            runner.begin_test(test.id)
            verdicts[test.id] = judge.run_tests([test], namespace)[0]
        notes.extend(judge.evidence_notes(proxies))
        return runner.first_error


def _raise_if_timed_out(gone: WorkerGone, what: str):
    """Running out of time ends the submission, with a reason naming `what` ran out and its
    budget; dying or flooding costs only what was running."""
    if gone.timed_out:
        raise SubmissionFailed(f"timed out: {what} {gone.overrun}")


class NotebookRunner:
    """The submission's notebook in a sandboxed worker; restarted without a cell that kills it.

    Each start (the first, and each restart) gets a fresh budget of `--timeout` for the worker's
    start and the cells; each test gets its own (`begin_test`). A timeout's reason names what
    ran out (a code cell by its number, or the test's call) and the budget it had."""

    def __init__(self, cells: list[str], options: Options, notes: list, write_yourself=()):
        self.cells, self.options, self.notes, self.write_yourself = cells, options, notes, write_yourself
        self.budget = self._budget("the cells")
        self.skipped, self.restarts, self.first_error = set(), 0, None
        self.worker, self.lost = None, False
        try:
            self._start()
        except BaseException:
            if self.worker is not None:
                self.worker.close()
            raise

    def _budget(self, what: str) -> Budget:
        return Budget(self.options.timeout, what, self.options.wall_factor)

    def _start(self):
        while True:
            # fresh at each start: a skipped cell costs no later one time
            self.budget = self._budget("the cells")
            try:
                self.worker = Sandbox(self.options.limits, self.budget, self.options.sandboxed)
            except WorkerGone as gone:
                _raise_if_timed_out(gone, "the sandbox's start (loading Python and torch)")
                raise SubmissionFailed(f"the sandbox could not start: {gone}") from None
            try:
                if self.write_yourself:  # the library's answers become stubs before any cell runs
                    self.worker.request({"op": "stub", "targets": list(self.write_yourself)}, self.budget)
            except WorkerGone as gone:
                _raise_if_timed_out(gone, "the sandbox's start (stubbing the library)")
                raise SubmissionFailed(f"the sandbox could not start: {gone}") from None
            for index, source in enumerate(self.cells):
                if index in self.skipped:
                    continue
                try:
                    error = self.worker.request({"op": "run_cell", "source": source},
                                                self.budget).get("error")
                except RequestFailed as failed:
                    error = str(failed)
                except WorkerGone as gone:
                    _raise_if_timed_out(gone, f"code cell {index + 1}")
                    self.skipped.add(index)
                    why = str(gone).removeprefix("the submission's process ")
                    self.notes.append(f"code cell {index + 1} stopped the submission's process ({why}); "
                                      "graded without that cell")
                    self._restart_allowed()
                    break
                if self.first_error is None and error:
                    self.first_error = "a code cell raised " + first_line(error, 200)
            else:
                return

    def _restart_allowed(self):
        self.worker.close()
        self.restarts += 1
        if self.restarts > MAX_RESTARTS:
            raise SubmissionFailed(f"the submission's process died {self.restarts} times")

    def begin_test(self, name: str = "the test"):
        """Each test gets its own budget; a worker lost in the previous test is restarted first."""
        if self.lost:
            self.lost = False
            self._restart_allowed()
            self._start()
        self.budget = self._budget(name)

    def request(self, message: dict) -> dict:
        """A request from a test running here; a worker that dies is restarted for the next test."""
        if self.lost:
            raise judge.SandboxFailure("the submission's process was lost earlier in this test")
        try:
            return self.worker.request(message, self.budget)
        except WorkerGone as gone:
            self.lost = True
            name, budget = str(message.get("name", "the test's call")), self.budget
            if not gone.timed_out:
                raise judge.SandboxFailure(f"{gone} while running {name}") from None
            if "backstop" in gone.overrun:  # the budget first: a reason may be cut short
                raise judge.SandboxFailure(f"{name} ran past the test's wall-clock backstop of "
                                           f"{budget.wall:.0f} s (a {budget.cpu:g} s CPU budget; "
                                           "it waits?)") from None
            raise judge.SandboxFailure(f"{name} ran past the test's budget of {budget.cpu:g} s of CPU time "
                                       "(an endless loop?)") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.worker.close()


def default_solutions() -> Path:
    """The course checkout's solutions, beside the package: never a folder of the working
    directory, which could be a learner's folder named `solutions`."""
    return Path(__file__).resolve().parents[2] / "solutions"


def load_exercises(folder: str | Path) -> dict[str, Exercise]:
    """Every exercise's tests, read once, before any submission runs."""
    found = find_solutions(folder)
    if not found:
        raise ValueError(f"no solution notebooks (ex*.ipynb) in {str(folder)!r}: pass --solutions DIR")
    return {key: load_exercise(path) for key, path in found.items()}


def plan_exercises(exercises: dict[str, Exercise], keys, jobs: int, options: Options) -> dict:
    """Each needed exercise's Plan (or why its solution could not be run), in parallel. The
    solutions run in the sandbox too (unless --unsafe-no-sandbox): nothing of a solutions folder
    runs unconfined."""
    def one(key):
        try:
            budget = Budget(CALIBRATION_SECONDS, f"the solution of {key}", options.wall_factor)
            return key, judge.calibrate(exercises[key], budget, options.limits, options.sandboxed)
        except Exception as error:
            return key, f"{type(error).__name__}: {first_line(error, 200)}"
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(pool.map(one, sorted(set(keys))))


def _address_space() -> int:
    """Bytes of address space this process maps now (VmSize), the base of a grading process's limit."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) << 10
    return 0


def _not_graded(path, exercise: Exercise | None, why: str) -> SubmissionResult:
    tests = [TestResult(t.id, 0.0, t.points, False, "not graded")
             for t in (exercise.tests if exercise else ())]
    return SubmissionResult(str(path), exercise.name if exercise else None, 0.0,
                            exercise.max_score if exercise else 0.0, f"not graded: {why}", tests,
                            graded=False)


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the sandboxes it has closed, each counted as its budgets
    count it (its control group, or its processes), so a learner's `setsid` children count too."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + Sandbox.closed_cpu_seconds


def grade_paths(paths: list, exercises: dict[str, Exercise], plans: dict, options: Options, jobs: int,
                budget: float | None = None):
    """Grade `paths` in the grading pool; yield (index, SubmissionResult) as each finishes.

    This is how `mpcourse grade` and Gradescope's harness both grade: each submission in a
    grading process of its own, under its own memory and time limit (at most `budget` seconds
    when one is given), its wall and CPU seconds recorded; one that cannot be graded still
    yields a result saying why."""
    def exercise_of(path):
        return exercises.get(exercise_id(Path(path).name) or "")

    def timed(path):
        cpu = _cpu_seconds()
        result = grade_submission(path, exercises, plans, options)
        result.cpu_seconds = _cpu_seconds() - cpu
        return result

    def seconds_for(path):
        limit = submission_backstop(exercise_of(path), options)
        return limit if budget is None else max(1.0, min(limit, budget))

    pool = grade_in_processes(paths, timed, seconds_for, jobs, _address_space() + options.grader_memory)
    with contextlib.closing(pool):  # however this stops, the pool's processes stop with it
        for index, result, why in pool:
            if result is None:
                result = _not_graded(paths[index], exercise_of(paths[index]), why)
                result.seconds = seconds_for(paths[index]) if "ran past" in why else 0.0
            yield index, result
