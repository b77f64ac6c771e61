"""`mpcourse grade`: a class graded from the command line. Each exercise's solution is run first
to plan its tests, then every submission in the grading pool (`grader.grade_paths`), with a
progress bar, results shown in the order given, and the gradebook written at the end."""
from __future__ import annotations

import json
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

NOT_GRADED = 3  # the exit status when some submission could not be graded


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
    elif not (isolation := choose_isolation()).usable:
        print(f"mpcourse grade: refusing to run submissions without a sandbox: {isolation.problem}",
              file=sys.stderr)
        return 2
    else:
        print(f"mpcourse grade: {isolation.summary()}", file=sys.stderr)
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
