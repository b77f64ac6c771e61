"""`mpcourse grade`: a class graded from the command line. Each exercise's solution is run first
to plan its tests, then every submission in the grading pool (`grader.grade_paths`), with a
progress bar, results shown in the order given, and the gradebook written at the end.

A SIGTERM or SIGINT (Ctrl-C) stops the run: every grading process and sandbox ends with it (the
pool's and the sandboxes' own stop), the gradebook of the submissions that finished is written,
and the exit status is 128 + the signal's number (143, 130)."""
from __future__ import annotations

import contextlib
import json
import signal
import sys
from pathlib import Path

from mpcourse.grading.sandbox import cgroup
from mpcourse.grading.judging import judge
from mpcourse.grading.judging.exercise import exercise_id
from mpcourse.grading.gradebook import format_result, format_summary, not_graded_report, write_gradebook
from mpcourse.grading.grader import (UNSAFE_NOTE, Options, default_solutions, grade_paths, load_exercises,
                                     plan_exercises)
from mpcourse.grading.instructor.progress import Progress, json_line
from mpcourse.grading.sandbox.isolation import choose_isolation
from mpcourse.grading.sandbox.sandbox import stop_every_sandbox
from mpcourse.grading.sandbox.stopping import STOP_SIGNALS, stop_handler

NOT_GRADED = 3  # the exit status when some submission could not be graded


class Stopped(BaseException):
    """The grader was told to stop (SIGTERM or SIGINT); no handler in the grading code swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, _frame):
    """The grader's own stop: its sandboxes (planning) die now; the rest as the exception unwinds.
    A second signal during that cleanup is ignored, so that the gradebook is written whole."""
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_IGN)
    stop_every_sandbox()
    raise Stopped(signum)


@contextlib.contextmanager
def _stoppable():
    """SIGTERM and SIGINT raise `Stopped` in the grader while the block runs; restored after."""
    previous = {stop_signal: signal.signal(stop_signal, stop_handler(_stop)) for stop_signal in STOP_SIGNALS}
    try:
        yield
    finally:
        for stop_signal, handler in previous.items():
            signal.signal(stop_signal, handler)


def grade_command(args) -> int:
    """Grade `args.paths`; exit status 0 when every submission was graded, NOT_GRADED when some
    could not be (each named on stderr, with why), 2 for bad arguments, 128 + the signal's number
    when stopped by SIGTERM or SIGINT."""
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
    elif not (isolation := choose_isolation()).usable:
        print(f"mpcourse grade: refusing to run submissions without a sandbox: {isolation.problem}",
              file=sys.stderr)
        return 2
    else:
        print(f"mpcourse grade: {isolation.summary()}", file=sys.stderr)
    options = Options(timeout=args.timeout, sandboxed=not args.unsafe_no_sandbox, solutions=solutions)
    results = [None] * len(args.paths)
    try:
        with _stoppable():
            _grade_class(args, exercises, options, results)
    except Stopped as stop:
        return _stopped(args, results, stop)
    return _finish(args, results)


def _grade_class(args, exercises: dict, options: Options, results: list) -> None:
    """Plan the exercises, then grade every path into `results` (in the order given), showing each."""
    keys = [exercise_id(Path(p).name) for p in args.paths]
    plans = plan_exercises(exercises, [k for k in keys if k in exercises], args.jobs, options)
    for key, plan in sorted(plans.items()):
        for problem in plan.problems if isinstance(plan, judge.Plan) else [f"{key}: {plan}"]:
            print(f"mpcourse grade: warning: {problem}", file=sys.stderr)
    jsonl = getattr(args, "jsonl", False)
    progress, shown = Progress(len(args.paths)), 0
    graded = grade_paths(list(args.paths), exercises, plans, options, args.jobs)
    try:
        for index, result in graded:
            results[index] = result
            progress.done(result)
            if jsonl:
                print(json_line(index, result), flush=True)
            while shown < len(results) and results[shown] is not None:  # in the order given
                if not args.json and not jsonl:
                    progress.bar.write(format_result(results[shown]), file=sys.stdout)
                shown += 1
    finally:
        graded.close()  # stops the pool's processes, however this ended
        progress.close()
        cgroup.sweep()  # the groups of grading processes killed past their time, or stopped


def _finish(args, results: list) -> int:
    """The gradebook, the summary (or JSON), and the exit status of a run that graded every path."""
    if args.csv:
        write_gradebook(results, args.csv)
    jsonl = getattr(args, "jsonl", False)
    if args.json and not jsonl:
        print(json.dumps({"submissions": [r.to_json() for r in results]}, indent=1, ensure_ascii=True))
    elif not args.json and not jsonl:
        print(format_summary(results))
    if report := not_graded_report(results):
        print(f"mpcourse grade: {report}", file=sys.stderr)
        return NOT_GRADED
    return 0


def _stopped(args, results: list, stop: Stopped) -> int:
    """A run stopped by a signal: the gradebook of what finished, and which were left ungraded."""
    finished = [result for result in results if result is not None]
    if args.csv:
        write_gradebook(finished, args.csv)
    written = f"; gradebook of those: {args.csv}" if args.csv else ""
    print(f"mpcourse grade: stopped by {stop}: {len(finished)} of {len(results)} submission(s) graded"
          f"{written}; not graded: {len(results) - len(finished)}", file=sys.stderr)
    return 128 + stop.signum
