"""`mpcourse grade`: score submitted notebooks, treating every one as hostile.

For each submission:
1. The exercise comes from the file name; the tests, hidden ones included, from the solution
   notebook, read before any submission runs. Metadata naming another exercise is reported.
2. The submission's code cells run in a fresh worker inside a sandbox (`sandbox`). A cell that
   kills its process is skipped and the worker restarted, as a learner would restart a kernel.
3. Each test runs either here, with the learner's functions called through the sandbox, or
   beside the learner's answers in a second fresh sandbox, its log of calls compared here with
   the solution's (`judge`). Either way the verdict is computed in this process.
4. Whatever happens, the submission gets a score and a one-line reason, and grading goes on;
   the gradebook is written atomically at the end (`gradebook`).
"""
from __future__ import annotations

import json
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat

from mpcourse.grading import judge
from mpcourse.grading.exercise import (Exercise, defines_any, exercise_id, find_solutions, is_check_cell,
                                       is_test_cell, load_exercise)
from mpcourse.grading.gradebook import SubmissionResult, format_result, format_summary, write_gradebook
from mpcourse.grading.sandbox import INSTALL_HINT, Limits, RequestFailed, Sandbox, WorkerGone, sandbox_problem
from mpcourse.grading.selfcheck import TestResult
from mpcourse.grading.verdict import first_line

MAX_RESTARTS = 3
MAX_NOTEBOOK_BYTES = 50 << 20
UNSAFE_NOTE = ("graded WITHOUT a sandbox (--unsafe-no-sandbox): the submission could read and change "
               "files, other submissions and this gradebook")


@dataclass(frozen=True)
class Options:
    timeout: float = 120.0
    sandboxed: bool = True
    limits: Limits = Limits()


class SubmissionFailed(Exception):
    """The submission as a whole could not be graded; the message is the one-line reason."""


def grade_submission(path, exercises: dict[str, Exercise], plans: dict, options: Options = Options()) -> SubmissionResult:
    """Score one submitted notebook against the tests of its exercise; never raises."""
    start = time.perf_counter()
    path = Path(path)
    exercise, tests, error, notes = exercises.get(exercise_id(path.name) or ""), [], None, []
    if not options.sandboxed:
        notes.append(UNSAFE_NOTE)
    try:
        if exercise is None:
            raise SubmissionFailed(f"cannot tell which exercise this is: {path.name!r} does not start with a known "
                                   f"exercise id (known: {', '.join(sorted(exercises)) or 'none'})")
        nb = _read_submission(path)
        claimed = nb.metadata.get("mpcourse", {}).get("exercise") if isinstance(nb.metadata.get("mpcourse"), dict) else None
        if claimed is not None and claimed != exercise.name:
            notes.append(f"the notebook's metadata says exercise {str(claimed)[:60]!r}; graded as "
                         f"{exercise.name}, from the file name")
        plan = plans.get(exercise_id(path.name))
        if not isinstance(plan, judge.Plan):
            raise SubmissionFailed(f"the solution of {exercise.name} could not be run to plan its tests: {plan}")
        tests, error = _grade(nb, exercise, plan, options, notes)
    except SubmissionFailed as failure:
        error = str(failure)
    except Exception as failure:  # a bug here must cost this submission only, not the run
        error = f"grading failed: {type(failure).__name__}: {first_line(failure, 200)}"
    if exercise is not None and not tests:
        tests = [TestResult(t.id, 0.0, t.points, False, error) for t in exercise.tests]
    return SubmissionResult(path=str(path), exercise=exercise.name if exercise else None,
                            score=sum(t.points for t in tests), max_score=exercise.max_score if exercise else 0.0,
                            error=error, tests=tests, seconds=time.perf_counter() - start, notes=notes)


def _read_submission(path: Path) -> nbformat.NotebookNode:
    """The notebook, if `path` is a regular file (a link could point at a solution) of sane size."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise SubmissionFailed(f"not a regular file (a link or a folder): {path}")
    if path.exists() and path.stat().st_size > MAX_NOTEBOOK_BYTES:
        raise SubmissionFailed(f"{path.stat().st_size:,} bytes: larger than the {MAX_NOTEBOOK_BYTES >> 20} MiB "
                               "a submitted notebook may have")
    try:
        with warnings.catch_warnings():  # old notebooks without cell ids are still fine to grade
            warnings.simplefilter("ignore")
            nb = nbformat.read(path, as_version=4)
            nbformat.validate(nb)
    except FileNotFoundError:
        raise SubmissionFailed(f"file not found: {path}") from None
    except Exception as error:
        raise SubmissionFailed(f"not a valid .ipynb notebook: {first_line(error, 200)}") from None
    return nb


def _grade(nb, exercise: Exercise, plan: judge.Plan, options: Options, notes: list) -> tuple[list, str | None]:
    cells = [c.source for c in nb.cells if c.cell_type == "code" and not is_test_cell(c) and not is_check_cell(c)]
    deadline = time.monotonic() + options.timeout
    verdicts, first_error = {}, None
    in_grader = [t for t in exercise.tests if plan.plain.get(t.id)]
    beside = [t for t in exercise.tests if not plan.plain.get(t.id)]
    if in_grader:
        with NotebookRunner(cells, options, deadline, notes) as runner:
            first_error = runner.first_error
            namespace = judge.grader_namespace(exercise, plan, runner.request)
            for test in in_grader:
                verdicts[test.id] = judge.run_in_grader(test, namespace)
                runner.raise_if_over()
    if beside:
        answer_cells = [c for c in cells if defines_any(c, exercise.answer_names)]
        try:
            with Sandbox(options.limits, deadline, options.sandboxed) as worker:
                reply = worker.request({"op": "record", "setup": list(exercise.setup), "answer_cells": answer_cells,
                                        "answers": list(exercise.answer_names),
                                        "tests": [[t.id, t.source] for t in beside]}, deadline)
        except WorkerGone as gone:
            _raise_if_timed_out(gone, options)
            reply = {"gone": str(gone)}
        except RequestFailed as failed:
            reply = {"gone": str(failed)}
        got = reply.get("tests") if type(reply.get("tests")) is list and len(reply["tests"]) == len(beside) else None
        for index, test in enumerate(beside):
            if "gone" in reply:
                verdicts[test.id] = (False, reply["gone"])
            elif got is None or type(got[index]) is not dict:
                verdicts[test.id] = (False, "the sandbox sent no result for this test")
            else:
                verdicts[test.id] = judge.beside_verdict(test, plan.calls[test.id], got[index])
        errors = reply.get("errors")
        if first_error is None and type(errors) is list and errors and type(errors[0]) is str:
            first_error = "a code cell raised " + first_line(errors[0], 200)
    results = [TestResult(t.id, t.points if verdicts[t.id][0] else 0.0, t.points, verdicts[t.id][0],
                          None if verdicts[t.id][0] else first_line(verdicts[t.id][1] or "failed", 300))
               for t in exercise.tests]
    return results, first_error


def _raise_if_timed_out(gone: WorkerGone, options: Options):
    """Running out of time ends the submission; dying or flooding costs only what was running."""
    if "timed out" in str(gone):
        raise SubmissionFailed(f"timed out: the submission ran longer than {options.timeout:g} s (an endless loop?)")


class NotebookRunner:
    """The submission's notebook in a sandboxed worker; restarted without a cell that kills it."""

    def __init__(self, cells: list[str], options: Options, deadline: float, notes: list):
        self.cells, self.options, self.deadline, self.notes = cells, options, deadline, notes
        self.skipped, self.restarts, self.first_error, self.over = set(), 0, None, None
        self.worker = None
        try:
            self._start()
        except BaseException:
            if self.worker is not None:
                self.worker.close()
            raise

    def _start(self):
        while True:
            try:
                self.worker = Sandbox(self.options.limits, self.deadline, self.options.sandboxed)
            except WorkerGone as gone:
                _raise_if_timed_out(gone, self.options)
                raise SubmissionFailed(f"the sandbox could not start: {gone}") from None
            for index, source in enumerate(self.cells):
                if index in self.skipped:
                    continue
                try:
                    error = self.worker.request({"op": "run_cell", "source": source}, self.deadline).get("error")
                except RequestFailed as failed:
                    error = str(failed)
                except WorkerGone as gone:
                    _raise_if_timed_out(gone, self.options)
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

    def request(self, message: dict) -> dict:
        """A request from a test running here; a worker that dies is restarted for the next test."""
        try:
            return self.worker.request(message, self.deadline)
        except WorkerGone as gone:
            try:
                _raise_if_timed_out(gone, self.options)
                self._restart_allowed()
                self._start()
            except SubmissionFailed as failure:
                self.over = failure
            raise judge.SandboxFailure(f"{gone} while running {message.get('name', 'the test')}") from None

    def raise_if_over(self):
        if self.over is not None:
            raise self.over

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.worker.close()


def default_solutions() -> Path:
    """`./solutions` when grading from a course checkout, else the one beside the package."""
    here = Path("solutions")
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "solutions"


def load_exercises(folder: str | Path) -> dict[str, Exercise]:
    """Every exercise's tests, read once, before any submission runs."""
    found = find_solutions(folder)
    if not found:
        raise ValueError(f"no solution notebooks (ex*.ipynb) in {str(folder)!r}: pass --solutions DIR")
    return {key: load_exercise(path) for key, path in found.items()}


def plan_exercises(exercises: dict[str, Exercise], keys, jobs: int, limits: Limits) -> dict:
    """Each needed exercise's Plan (or why its solution could not be run), in parallel."""
    def one(key):
        try:
            return key, judge.calibrate(exercises[key], time.monotonic() + 900, limits)
        except Exception as error:
            return key, f"{type(error).__name__}: {first_line(error, 200)}"
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(pool.map(one, sorted(set(keys))))


_POOL_STATE = {}


def _init_pool(exercises, plans, options):
    _POOL_STATE.update(exercises=exercises, plans=plans, options=options)


def _grade_in_pool(path):
    return grade_submission(path, _POOL_STATE["exercises"], _POOL_STATE["plans"], _POOL_STATE["options"])


def grade_command(args) -> int:
    try:
        exercises = load_exercises(args.solutions or default_solutions())
    except ValueError as error:
        print(f"mpcourse grade: {error}", file=sys.stderr)
        return 2
    for name, value, low in (("--timeout", args.timeout, 0), ("--jobs", args.jobs, 0)):
        if value is None or value <= low:
            print(f"mpcourse grade: {name} must be positive, got {value}", file=sys.stderr)
            return 2
    if args.unsafe_no_sandbox:
        print(f"mpcourse grade: WARNING: {UNSAFE_NOTE}", file=sys.stderr)
    elif problem := sandbox_problem():
        print(f"mpcourse grade: refusing to run submissions without a sandbox: {problem}. {INSTALL_HINT}",
              file=sys.stderr)
        return 2
    options = Options(timeout=args.timeout, sandboxed=not args.unsafe_no_sandbox)
    keys = [exercise_id(Path(p).name) for p in args.paths]
    plans = plan_exercises(exercises, [k for k in keys if k in exercises], args.jobs, options.limits)
    for key, plan in sorted(plans.items()):
        for problem in plan.problems if isinstance(plan, judge.Plan) else [f"{key}: {plan}"]:
            print(f"mpcourse grade: warning: {problem}", file=sys.stderr)
    results = []
    with ProcessPoolExecutor(max_workers=args.jobs, initializer=_init_pool, initargs=(exercises, plans, options)) as pool:
        futures = [pool.submit(_grade_in_pool, path) for path in args.paths]
        for path, future in zip(args.paths, futures):
            try:
                result = future.result()
            except Exception as error:  # the grading process itself died
                exercise = exercises.get(exercise_id(Path(path).name) or "")
                result = SubmissionResult(str(path), exercise.name if exercise else None, 0.0,
                                          exercise.max_score if exercise else 0.0,
                                          f"grading failed: {type(error).__name__}", [
                                              TestResult(t.id, 0.0, t.points, False, "grading failed")
                                              for t in (exercise.tests if exercise else ())])
            results.append(result)
            if not args.json:
                print(format_result(result), flush=True)
    if args.csv:
        write_gradebook(results, args.csv)
    if args.json:
        print(json.dumps({"submissions": [r.to_json() for r in results]}, indent=1))
    else:
        print(format_summary(results))
    return 0
