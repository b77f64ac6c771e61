"""The instructor's commands of `mpcourse`: release, grade, gradebook, collect, feedback, report
and autograder, in the order of INSTRUCTORS.md's loop. Each loads what it needs when it runs, so
`mpcourse --help` answers at once."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mpcourse.grading.instructor import arguments


def _refuse(command: str, error) -> int:
    """Say on stderr why `mpcourse COMMAND` cannot go on; return the exit status for bad input."""
    print(f"mpcourse {command}: error: {arguments.one_line(error)}", file=sys.stderr)
    return arguments.BAD_INPUT


def _release(args: argparse.Namespace) -> int:
    from mpcourse.grading.judging.release import release_all
    try:
        for written in release_all(args.solutions, args.exercises, args.visible_tests):
            print(f"wrote {written}")
    except (ValueError, OSError) as error:
        return _refuse("release", error)
    return 0


def _grade(args: argparse.Namespace) -> int:
    from mpcourse.grading.instructor.class_run import grade_command
    from mpcourse.grading.platforms.lms import parse_systems, write_lms_gradebook
    systems = parse_systems(args.lms)  # each name checked as the command line was read
    if systems and not args.csv:
        return _refuse("grade", "--lms writes its gradebook beside the --csv one: add --csv FILE")
    status = grade_command(args)
    for system in systems if args.csv and os.path.isfile(args.csv) else ():
        try:
            print(f"{system} gradebook: {write_lms_gradebook(system, args.csv)}", file=sys.stderr)
        except ValueError as error:
            print(f"mpcourse grade: no {system} gradebook: {error}", file=sys.stderr)
            status = status or 2
    return status


def _gradebook(args: argparse.Namespace) -> int:
    """`mpcourse gradebook export`: LMS imports from an existing gradebook, without grading again."""
    from mpcourse.grading.platforms.lms import parse_systems, write_lms_gradebook
    try:
        ids = dict(args.assignment_id or ())
        for system in parse_systems(args.lms):
            print(f"wrote {write_lms_gradebook(system, args.gradebook, assignment_ids=ids)}")
    except (ValueError, OSError) as error:
        return _refuse("gradebook export", error)
    return 0


def _collect(args: argparse.Namespace) -> int:
    """`mpcourse collect`: an LMS's bulk download laid out as submissions/<learner>/<exercise>.ipynb."""
    from mpcourse.grading.instructor.collect import collect
    from mpcourse.grading.judging.exercise import find_solutions
    from mpcourse.grading.grader import default_solutions
    try:
        names = [path.stem for path in find_solutions(args.solutions or default_solutions()).values()]
        found = collect(args.system, args.download, args.out, names, args.roster)
    except (ValueError, OSError) as error:
        return _refuse("collect", error)
    for message in found.messages:
        print(f"mpcourse collect: {message}", file=sys.stderr)
    learners = {learner for learner, _ in found.placed}
    print(f"placed {len(found.placed)} notebook(s) of {len(learners)} learner(s) in {args.out}; "
          f"{len(found.messages)} message(s) above")
    return 0


def _feedback(args: argparse.Namespace) -> int:
    from mpcourse.grading.instructor.feedback import write_feedback
    from mpcourse.grading.grader import default_solutions
    try:
        pages = write_feedback(args.gradebook, args.solutions or default_solutions(), args.out)
    except (ValueError, OSError) as error:
        return _refuse("feedback", error)
    print(f"wrote {sum(map(len, pages.values()))} page(s) and {len(pages)} zip(s) in {args.out}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from mpcourse.grading.instructor.report import write_report
    try:
        print(f"wrote {write_report(args.gradebook, args.out)}")
    except (ValueError, OSError) as error:
        return _refuse("report", error)
    return 0


def _autograder(args: argparse.Namespace) -> int:
    """`mpcourse autograder gradescope|github-classroom`: files for grading on those platforms."""
    try:
        if args.platform == "gradescope":
            from mpcourse.grading.platforms.gradescope_zip import build_autograder
            if bool(args.all) == bool(args.exercises):
                raise ValueError("name the exercises to grade (e.g. ex00_bytes), or pass --all; not both")
            config = build_autograder(args.solutions, args.out, None if args.all else args.exercises,
                                      args.hidden_visibility, args.timeout, args.allow_unsandboxed,
                                      args.total_seconds)
            print(f"wrote {args.out}: {', '.join(e['name'] for e in config['exercises'])}")
        else:
            from mpcourse.grading.platforms.classroom import write_classroom
            for path in write_classroom(args.exercises_dir, args.out, args.timeout_minutes):
                print(f"wrote {path}")
    except ValueError as error:
        return _refuse("autograder", error)
    return 0


def _lms_systems(text: str) -> str:
    """An --lms check: names from canvas, moodle, blackboard, comma-separated."""
    from mpcourse.grading.platforms.lms import parse_systems
    try:
        parse_systems([text])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--lms ")) from None
    return text


def _assignment_id(text: str) -> tuple[str, str]:
    """An --assignment-id check: EXERCISE=ID, the exercise's name and Canvas's number for it."""
    exercise, equals, number = text.partition("=")
    if not (equals and exercise.strip() and number.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not EXERCISE=ID (allowed: an exercise's name, "
                                         "'=' and Canvas's assignment number, as ex00_bytes=1234)")
    return exercise.strip(), number.strip()


def _default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _add_release(commands) -> None:
    release = commands.add_parser("release", help="regenerate exercises/ from solutions/")
    release.add_argument("--solutions", default="solutions", type=arguments.solutions_folder,
                         help="folder of solution notebooks (default: %(default)s)")
    release.add_argument("--exercises", default="exercises", type=arguments.output_folder,
                         help="folder to write learner notebooks to (default: %(default)s)")
    release.add_argument("--visible-tests", type=arguments.output_folder,
                         help="folder of the package's copy of the visible tests, which check() runs "
                              "where the notebook's file is not at hand (default: "
                              "mpcourse/grading/visible_tests beside the solutions folder, in the "
                              "course's checkout)")
    release.set_defaults(handler=_release)


def _add_grade(commands) -> None:
    grade = commands.add_parser(
        "grade", help="grade submitted exercise notebooks",
        epilog="Put the paths after -- when a folder's name may begin with '-': mpcourse grade --csv g.csv "
               "-- submissions/*/ex00_bytes.ipynb. Exit status: 0 when every submission was graded (whatever "
               "its score), 3 when some could not be (named on stderr, with why), 2 for bad arguments, "
               "143 (SIGTERM) or 130 (SIGINT) when stopped, after writing the gradebook of what finished.")
    grade.add_argument("paths", nargs="+", metavar="PATH", type=arguments.existing_file,
                       help="submitted .ipynb files")
    grade.add_argument("--solutions", default=None, type=arguments.solutions_folder,
                       help="folder of solution notebooks holding the tests (default: the course's "
                            "solutions/)")
    grade.add_argument("--timeout", type=arguments.positive, default=120.0,
                       help="seconds for a submission's cells, all together, and again for each test "
                            "(default: %(default)s)")
    grade.add_argument("--jobs", type=arguments.at_least(1), default=_default_jobs(),
                       help="submissions graded at once, each in its own sandbox (default: the %(default)s "
                            "cores)")
    grade.add_argument("--csv", metavar="FILE", type=arguments.output_file,
                       help="also write a gradebook: one row per submission and test")
    grade.add_argument("--json", action="store_true",
                       help="print one JSON object on stdout instead of tables")
    grade.add_argument("--jsonl", action="store_true",
                       help="print one JSON line per submission on stdout as each finishes, instead of "
                            "tables")
    grade.add_argument("--unsafe-no-sandbox", action="store_true",
                       help="grade without bubblewrap's sandbox: submissions can then read and change "
                            "this machine's files (a warning goes to the output and the gradebook)")
    grade.add_argument("--lms", action="append", metavar="SYSTEM", type=_lms_systems,
                       help="also write an LMS import beside --csv (gradebook.csv -> gradebook.canvas.csv): "
                            "one row per learner (the folder holding the notebook), one column per exercise; "
                            "canvas, moodle or blackboard, several as --lms canvas,moodle or repeated")
    grade.set_defaults(handler=_grade)


def _add_gradebook(commands) -> None:
    gradebook = commands.add_parser("gradebook", help="convert a gradebook without grading again")
    actions = gradebook.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser("export",
                                help="write LMS imports from a gradebook `mpcourse grade --csv` wrote")
    export.add_argument("gradebook", type=arguments.existing_file, help="the per-test gradebook CSV")
    export.add_argument("--lms", action="append", required=True, metavar="SYSTEM", type=_lms_systems,
                        help="canvas, moodle or blackboard (several: canvas,moodle); writes "
                             "gradebook.SYSTEM.csv")
    export.add_argument("--assignment-id", action="append", metavar="EXERCISE=ID", type=_assignment_id,
                        help="Canvas: the id of an existing assignment (ex00_bytes=1234), so the import "
                             "updates it instead of creating a new one")
    export.set_defaults(handler=_gradebook)


def _add_collect(commands) -> None:
    collect = commands.add_parser("collect", help="lay out an LMS's bulk download as submissions/<learner>/")
    collect.add_argument("download", type=_download,
                         help="the LMS's 'download all submissions' zip, or its unpacked folder")
    collect.add_argument("--from", dest="system", required=True, choices=("canvas", "moodle"))
    collect.add_argument("--out", default="submissions", type=arguments.output_folder,
                         help="the class folder to write (default: %(default)s)")
    collect.add_argument("--roster", default=None, type=arguments.existing_file,
                         help="Moodle: a CSV with columns name and login, naming each learner's folder by "
                              "login")
    collect.add_argument("--solutions", default=None, type=arguments.solutions_folder,
                         help="folder of solution notebooks (default: the course's)")
    collect.set_defaults(handler=_collect)


def _download(text: str) -> str:
    """A `collect` check: the LMS's download, a zip file or the folder it unpacks to."""
    import zipfile
    path = Path(text)
    if not (path.is_dir() or (path.is_file() and zipfile.is_zipfile(path))):
        what = "is not a zip file" if path.is_file() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {what} (allowed: the LMS's download, a zip file or "
                                         "its unpacked folder)")
    return text


def _add_feedback(commands) -> None:
    feedback = commands.add_parser("feedback",
                                   help="one HTML page per learner and exercise, a zip per learner")
    feedback.add_argument("gradebook", type=arguments.existing_file,
                          help="the per-test gradebook CSV (the notebooks it names are read)")
    feedback.add_argument("--out", default="feedback", type=arguments.output_folder,
                          help="folder to write (default: %(default)s)")
    feedback.add_argument("--solutions", default=None, type=arguments.solutions_folder,
                          help="folder of solution notebooks (default: the course's)")
    feedback.set_defaults(handler=_feedback)


def _add_report(commands) -> None:
    report = commands.add_parser("report", help="an HTML page of the class: scores, hardest tests, slowest")
    report.add_argument("gradebook", type=arguments.existing_file, help="the per-test gradebook CSV")
    report.add_argument("--out", default="report.html", type=arguments.output_file,
                        help="the page to write (default: %(default)s)")
    report.set_defaults(handler=_report)


def _add_gradescope(platforms) -> None:
    gradescope = platforms.add_parser("gradescope", help="write a Gradescope autograder zip")
    gradescope.add_argument("exercises", nargs="*", metavar="EXERCISE",
                            help="exercises to grade (ex00 or ex00_bytes)")
    gradescope.add_argument("--all", action="store_true",
                            help="every exercise in --solutions, in one autograder")
    gradescope.add_argument("--solutions", default="solutions", type=arguments.solutions_folder,
                            help="folder of solution notebooks (default: %(default)s)")
    gradescope.add_argument("--out", required=True, help="the zip to write",
                            type=arguments.with_suffix(arguments.output_file, ".zip"))
    gradescope.add_argument("--hidden-visibility", default="after_published",
                            choices=("after_published", "hidden", "after_due_date"),
                            help="when learners see tests that hold hidden lines (default: %(default)s)")
    gradescope.add_argument("--timeout", type=arguments.positive, default=120.0,
                            help="seconds each notebook may run (default: %(default)s)")
    gradescope.add_argument("--total-seconds", type=arguments.positive, default=540.0,
                            help="seconds a whole run may take; keep it under the assignment's Gradescope "
                                 "autograder timeout (default: %(default)s, under Gradescope's default 10 "
                                 "min)")
    gradescope.add_argument("--allow-unsandboxed", action="store_true",
                            help="where bubblewrap cannot run, grade anyway, unprotected (INSTRUCTORS.md "
                                 "says what a submission can then do); by default such a run refuses")


def _add_classroom(platforms) -> None:
    classroom = platforms.add_parser("github-classroom", help="write a workflow running the visible tests")
    classroom.add_argument("--exercises", dest="exercises_dir", default="exercises",
                           help="learner notebooks, as the path from the course's root (the nearest folder "
                                "above holding pyproject.toml), wherever this runs (default: %(default)s)")
    classroom.add_argument("--out", default=None, type=arguments.output_folder,
                           help="repository root to write .github/ into (default: the course's root)")
    classroom.add_argument("--timeout-minutes", type=arguments.at_least(1), default=10,
                           help="per test step (default: %(default)s)")


def _add_autograder(commands) -> None:
    autograder = commands.add_parser("autograder",
                                     help="grade a large class on Gradescope or in GitHub Classroom")
    platforms = autograder.add_subparsers(dest="platform", metavar="PLATFORM", required=True)
    _add_gradescope(platforms)
    _add_classroom(platforms)
    autograder.set_defaults(handler=_autograder)


def add_instructor_commands(commands) -> None:
    """Add the instructor's commands to `mpcourse`'s subparsers, in INSTRUCTORS.md's order."""
    for add in (_add_release, _add_grade, _add_gradebook, _add_collect, _add_feedback, _add_report,
                _add_autograder):
        add(commands)
