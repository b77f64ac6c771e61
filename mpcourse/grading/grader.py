"""`mpcourse grade`: score submitted notebooks, treating every one as hostile.

For each submission:
1. The exercise comes from the file name; the tests, hidden ones included, from the solution
   notebook, read before any submission runs. Metadata naming another exercise is reported.
   A path that leads into the solutions folder (through a link anywhere in it) is refused.
2. The submission's code cells run in a fresh worker inside a sandbox (`sandbox`). A cell that
   kills its process is skipped and the worker restarted, as a learner would restart a kernel.
3. Each test runs either here, with the learner's functions called through the sandbox, or
   beside the learner's answers in a second fresh sandbox, its log of calls compared here with
   the solution's (`judge`). Either way the verdict is computed in this process. Each test has
   its own time limit: a test that runs out fails alone, and the points earned before it stay.
4. Whatever happens, the submission gets a score and a one-line reason, and grading goes on.
   Each submission is graded in a process of its own, with its own memory and time limit
   (`pool`); one that cannot be graded is reported, and the exit status says so. The gradebook
   is written atomically at the end (`gradebook`).
"""
from __future__ import annotations

import json
import resource
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat

from mpcourse.grading import cgroup, judge
from mpcourse.grading.exercise import (Exercise, exercise_id, find_solutions, is_check_cell,
                                       is_test_cell, load_exercise)
from mpcourse.grading.gradebook import (SubmissionResult, format_result, format_summary, not_graded_report,
                                       write_gradebook)
from mpcourse.grading.pool import OutOfTime, grade_in_processes
from mpcourse.grading.progress import Progress, json_line
from mpcourse.grading.sandbox import INSTALL_HINT, Limits, RequestFailed, Sandbox, WorkerGone, sandbox_problem
from mpcourse.grading.selfcheck import TestResult
from mpcourse.grading.verdict import first_line

MAX_RESTARTS = 3
MAX_NOTEBOOK_BYTES = 50 << 20
UNSAFE_NOTE = ("graded WITHOUT a sandbox (--unsafe-no-sandbox): the submission could read and change "
               "files, other submissions and this gradebook")


NOT_GRADED = 3  # the exit status when some submission could not be graded


@dataclass(frozen=True)
class Options:
    timeout: float = 120.0               # seconds for the notebook's cells, and again for each test
    sandboxed: bool = True
    limits: Limits = Limits()
    solutions: Path | None = None        # resolved once; no submission may lie inside it
    grader_memory: int = 3 << 30         # bytes of address space a grading process may add to the grader's


def submission_seconds(exercise: Exercise | None, options: Options) -> float:
    """The most one submission's grading may take: its cells once per start, and each test."""
    tests = len(exercise.tests) if exercise else 0
    return options.timeout * (tests + 2 + MAX_RESTARTS) + 60


class SubmissionFailed(Exception):
    """The submission as a whole could not be graded; the message is the one-line reason."""


def grade_submission(path, exercises: dict[str, Exercise], plans: dict, options: Options = Options()) -> SubmissionResult:
    """Score one submitted notebook against the tests of its exercise; never raises."""
    start = time.perf_counter()
    path = Path(path)
    exercise, verdicts, error, notes, graded = exercises.get(exercise_id(path.name) or ""), {}, None, [], True
    if not options.sandboxed:
        notes.append(UNSAFE_NOTE)
    try:
        _refuse_solutions(path, options)
        if exercise is None:
            raise SubmissionFailed(f"cannot tell which exercise this is: {path.name!r} does not start with a known "
                                   f"exercise id (known: {', '.join(sorted(exercises)) or 'none'})")
        nb = _read_submission(path, notes)
        claimed = nb.metadata.get("mpcourse", {}).get("exercise") if isinstance(nb.metadata.get("mpcourse"), dict) else None
        if claimed is not None and claimed != exercise.name:
            notes.append(f"the notebook's metadata says exercise {str(claimed)[:60]!r}; graded as "
                         f"{exercise.name}, from the file name")
        plan = plans.get(exercise_id(path.name))
        if not isinstance(plan, judge.Plan):
            raise SubmissionFailed(f"the solution of {exercise.name} could not be run to plan its tests: {plan}")
        error = _grade(nb, exercise, plan, options, notes, verdicts)
    except SubmissionFailed as failure:
        error = str(failure)
    except OutOfTime:
        error = f"timed out: grading this submission took longer than {submission_seconds(exercise, options):g} s"
    except Exception as failure:  # a bug here must cost this submission only, not the run
        error, graded = f"grading failed: {type(failure).__name__}: {first_line(failure, 200)}", False
    tests = [TestResult(t.id, t.points if verdicts[t.id][0] else 0.0, t.points, verdicts[t.id][0],
                        None if verdicts[t.id][0] else first_line(verdicts[t.id][1] or "failed", 300))
             if t.id in verdicts else TestResult(t.id, 0.0, t.points, False, error)
             for t in (exercise.tests if exercise else ())]
    return SubmissionResult(path=str(path), exercise=exercise.name if exercise else None,
                            score=sum(t.points for t in tests), max_score=exercise.max_score if exercise else 0.0,
                            error=error, tests=tests, seconds=time.perf_counter() - start, notes=notes, graded=graded)


def _refuse_solutions(path: Path, options: Options):
    """A submission that is, or leads through links to, a file in the solutions folder is
    refused, and so is a hard link to one of its files (same device and inode)."""
    if options.solutions is None:
        return
    if path.resolve().is_relative_to(options.solutions):
        raise SubmissionFailed(f"refused: this path leads into the solutions folder {str(options.solutions)!r}")
    try:
        found = path.stat()
    except OSError:
        return  # reading it says what is wrong
    if any(found.st_ino == known.st_ino and found.st_dev == known.st_dev
           for known in map(Path.stat, options.solutions.glob("*.ipynb"))):
        raise SubmissionFailed(f"refused: this file is a solution of {str(options.solutions)!r} (a hard link)")


def _read_submission(path: Path, notes: list) -> nbformat.NotebookNode:
    """The notebook, if `path` is a regular file (a link could point at a solution) of sane size.
    One that Jupyter opens but the nbformat schema rejects is graded, with a note saying so."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise SubmissionFailed(f"not a regular file (a link or a folder): {path}")
    if path.exists() and path.stat().st_size > MAX_NOTEBOOK_BYTES:
        raise SubmissionFailed(f"{path.stat().st_size:,} bytes: larger than the {MAX_NOTEBOOK_BYTES >> 20} MiB "
                               "a submitted notebook may have")
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


def _grade(nb, exercise: Exercise, plan: judge.Plan, options: Options, notes: list, verdicts: dict) -> str | None:
    """Fill `verdicts` (test id -> (passed, reason)) test by test; return the first cell error.
    On a timeout or a failure, the verdicts already filled stay."""
    cells = [c.source for c in nb.cells if c.cell_type == "code" and not is_test_cell(c) and not is_check_cell(c)]
    first_error = None
    in_grader = [t for t in exercise.tests if plan.plain.get(t.id)]
    beside = [t for t in exercise.tests if not plan.plain.get(t.id)]
    if in_grader:
        with NotebookRunner(cells, options, notes, exercise.write_yourself) as runner:
            first_error = runner.first_error
            namespace = judge.grader_namespace(exercise, plan, runner.request)
            for test in in_grader:
                runner.begin_test()
                verdicts[test.id] = judge.run_in_grader(test, namespace)
            notes.extend(judge.evidence_notes(namespace))
    if beside:
        deadline = time.monotonic() + options.timeout * (1 + len(beside))  # the cells', then each test's
        try:
            with Sandbox(options.limits, deadline, options.sandboxed) as worker:
                reply = judge.record_beside(worker, exercise, cells, beside, plan.splits, deadline)
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
                verdicts[test.id] = judge.beside_verdict(plan, test.id, got[index])
        errors = reply.get("errors")
        if first_error is None and type(errors) is list and errors and type(errors[0]) is str:
            first_error = "a code cell raised " + first_line(errors[0], 200)
    return first_error


def _raise_if_timed_out(gone: WorkerGone, options: Options):
    """Running out of time ends the submission; dying or flooding costs only what was running."""
    if "timed out" in str(gone):
        raise SubmissionFailed(f"timed out: the submission ran longer than {options.timeout:g} s (an endless loop?)")


class NotebookRunner:
    """The submission's notebook in a sandboxed worker; restarted without a cell that kills it."""

    def __init__(self, cells: list[str], options: Options, notes: list, write_yourself=()):
        self.cells, self.options, self.notes, self.write_yourself = cells, options, notes, write_yourself
        self.deadline = 0.0
        self.skipped, self.restarts, self.first_error = set(), 0, None
        self.worker, self.lost = None, False
        try:
            self._start()
        except BaseException:
            if self.worker is not None:
                self.worker.close()
            raise

    def _start(self):
        self.deadline = time.monotonic() + self.options.timeout  # for the cells, at each start
        while True:
            try:
                self.worker = Sandbox(self.options.limits, self.deadline, self.options.sandboxed)
            except WorkerGone as gone:
                _raise_if_timed_out(gone, self.options)
                raise SubmissionFailed(f"the sandbox could not start: {gone}") from None
            if self.write_yourself:  # the library's answers become stubs before any cell runs
                self.worker.request({"op": "stub", "targets": list(self.write_yourself)}, self.deadline)
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

    def begin_test(self):
        """Each test gets its own time; a worker lost in the previous test is restarted first."""
        if self.lost:
            self.lost = False
            self._restart_allowed()
            self._start()
        self.deadline = time.monotonic() + self.options.timeout

    def request(self, message: dict) -> dict:
        """A request from a test running here; a worker that dies is restarted for the next test."""
        if self.lost:
            raise judge.SandboxFailure("the submission's process was lost earlier in this test")
        try:
            return self.worker.request(message, self.deadline)
        except WorkerGone as gone:
            what = (f"ran longer than the test's {self.options.timeout:g} s" if "timed out" in str(gone)
                    else str(gone).removeprefix("the submission's process "))
            self.lost = True
            raise judge.SandboxFailure(f"the submission's process {what} while running "
                                       f"{message.get('name', 'the test')}") from None

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
            return key, judge.calibrate(exercises[key], time.monotonic() + 900, options.limits, options.sandboxed)
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
    return SubmissionResult(str(path), exercise.name if exercise else None, 0.0, exercise.max_score if exercise else 0.0,
                            f"not graded: {why}", [TestResult(t.id, 0.0, t.points, False, "not graded")
                                                   for t in (exercise.tests if exercise else ())], graded=False)


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (the sandboxes it started)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


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
        limit = submission_seconds(exercise_of(path), options)
        return limit if budget is None else max(1.0, min(limit, budget))

    for index, result, why in grade_in_processes(paths, timed, seconds_for, jobs,
                                                 _address_space() + options.grader_memory):
        if result is None:
            result = _not_graded(paths[index], exercise_of(paths[index]), why)
            result.seconds = seconds_for(paths[index]) if "ran past" in why else 0.0
        yield index, result


def grade_command(args) -> int:
    """Grade `args.paths`; exit status 0 when every submission was graded, NOT_GRADED when some
    could not be (each named on stderr, with why), 2 for bad arguments."""
    sys.stdout.reconfigure(errors="backslashreplace")  # whatever the terminal's encoding
    try:
        solutions = (Path(args.solutions) if args.solutions else default_solutions()).resolve()
        exercises = load_exercises(solutions)
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
    options = Options(timeout=args.timeout, sandboxed=not args.unsafe_no_sandbox, solutions=solutions)
    keys = [exercise_id(Path(p).name) for p in args.paths]
    plans = plan_exercises(exercises, [k for k in keys if k in exercises], args.jobs, options)
    for key, plan in sorted(plans.items()):
        for problem in plan.problems if isinstance(plan, judge.Plan) else [f"{key}: {plan}"]:
            print(f"mpcourse grade: warning: {problem}", file=sys.stderr)

    results = [None] * len(args.paths)
    progress, shown = Progress(len(args.paths)), 0
    for index, result in grade_paths(list(args.paths), exercises, plans, options, args.jobs):
        results[index] = result
        progress.done(result)
        if getattr(args, "jsonl", False):
            print(json_line(index, result), flush=True)
        while shown < len(results) and results[shown] is not None:  # in the order given
            if not args.json and not getattr(args, "jsonl", False):
                progress.bar.write(format_result(results[shown]), file=sys.stdout)
            shown += 1
    progress.close()
    cgroup.sweep()
    if args.csv:
        write_gradebook(results, args.csv)
    if args.json and not getattr(args, "jsonl", False):
        print(json.dumps({"submissions": [r.to_json() for r in results]}, indent=1, ensure_ascii=True))
    elif not args.json and not getattr(args, "jsonl", False):
        print(format_summary(results))
    if report := not_graded_report(results):
        print(f"mpcourse grade: {report}", file=sys.stderr)
        return NOT_GRADED
    return 0
