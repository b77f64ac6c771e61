"""The `mpcourse` command: `mpcourse <subcommand> --help` describes each one."""
from __future__ import annotations

import argparse
import os
import sys


def _doctor(args: argparse.Namespace) -> int:
    from mpcourse.hardware import format_report, report
    print(format_report(report()))
    return 0


def _release(args: argparse.Namespace) -> int:
    from mpcourse.grading.release import release_all
    for written in release_all(args.solutions, args.exercises):
        print(f"wrote {written}")
    return 0


def _grade(args: argparse.Namespace) -> int:
    from mpcourse.grading.grader import grade_command
    return grade_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mpcourse", description="The mixed-precision training course: tools for learners and instructors.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    doctor = commands.add_parser("doctor", help="what this machine can do with each precision")
    doctor.set_defaults(handler=_doctor)

    release = commands.add_parser("release", help="regenerate exercises/ from solutions/")
    release.add_argument("--solutions", default="solutions", help="folder of solution notebooks (default: %(default)s)")
    release.add_argument("--exercises", default="exercises", help="folder to write learner notebooks to (default: %(default)s)")
    release.set_defaults(handler=_release)

    grade = commands.add_parser("grade", help="grade submitted exercise notebooks")
    grade.add_argument("paths", nargs="+", metavar="PATH", help="submitted .ipynb files")
    grade.add_argument("--solutions", default=None,
                       help="folder of solution notebooks holding the tests (default: the course's solutions/)")
    grade.add_argument("--timeout", type=float, default=120.0,
                       help="seconds each submission may run, all cells together (default: %(default)s)")
    grade.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                       help="submissions graded at once, each in its own kernel (default: %(default)s)")
    grade.add_argument("--csv", metavar="FILE", help="also write a gradebook: one row per submission and test")
    grade.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of tables")
    grade.set_defaults(handler=_grade)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
