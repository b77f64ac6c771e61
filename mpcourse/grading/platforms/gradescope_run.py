"""What `run_autograder` runs in Gradescope's container: grade the submission, write results.json.

Gradescope's layout (gradescope/autograder_samples, docs/specs.md): the zip unpacked in
<root>/source, the learner's upload in <root>/submission, results in <root>/results/results.json,
and everything printed goes to the instructor only. The root is a parameter, so the tests lay
the same folders out in a temporary directory.

Before anything runs, a provisional results.json is written: every test at 0, "grading did not
finish". Each expected exercise's notebook is then copied (a regular file, never a link, read
once) under the exercise's own name into a private scratch folder, so an upload called
`homework (2).ipynb` is graded too, and graded by `grader.grade_paths`, the grading pool
`mpcourse grade` uses: a process per notebook under its own limits, in the same sandbox. The
whole run keeps within `total_seconds` (a setting in the zip, under Gradescope's own timeout),
and results.json is rewritten atomically after each notebook, so a run killed at Gradescope's
limit still leaves a valid file with what was graded. Re-uploads and files that could not be
placed are listed in the output the learner sees.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from mpcourse.grading.judging.exercise import exercise_id
from mpcourse.grading.gradebook import format_result
from mpcourse.grading.grader import Options, grade_paths, load_exercises, plan_exercises
from mpcourse.grading.platforms.gradescope_results import Expected, results_json, write_results
from mpcourse.grading.sandbox.isolation import USER, choose_isolation, unreachable_by_others

CONFIG = "mpcourse-autograder.json"
MAX_UPLOAD_BYTES = 64 << 20  # larger notebooks are cut here; the grader refuses them anyway
DEFAULT_TOTAL_SECONDS = 540.0  # under Gradescope's default autograder timeout of 10 minutes
PENDING = "grading did not finish; your submission was received"
NO_SANDBOX = "the autograder could not start; your submission was received. Your instructor can see why"
OUT_OF_TIME = ("not graded: the autograder's total time ran out before this notebook; your submission was "
               "received")
MIN_SECONDS = 10.0  # a notebook is not started with less time than this left


def read_config(source: Path) -> tuple[dict, list[Expected]]:
    config = json.loads((source / CONFIG).read_text())
    expected = [Expected(e["name"], tuple((test_id, float(points)) for test_id, points in e["tests"]),
                         frozenset(e["hidden"])) for e in config["exercises"]]
    return config, expected


def notebooks(folder: Path) -> list[Path]:
    """Regular .ipynb files anywhere under `folder`, links neither followed nor taken."""
    found = []
    for top, folders, files in os.walk(folder, followlinks=False):
        folders[:] = sorted(f for f in folders if not f.startswith((".", "__MACOSX")))
        found += [Path(top) / name for name in sorted(files)
                  if name.endswith(".ipynb") and not name.startswith(".")
                  and not (Path(top) / name).is_symlink()]
    return found


def choose(uploaded: list[Path], expected: list[Expected]) -> tuple[dict[str, Path], list[str]]:
    """The notebook to grade for each expected exercise, and what the learner should know.

    A notebook counts for an exercise when its name starts with the exercise's id (ex00...); one
    named exactly like the exercise wins over others, and the others are reported as not graded.
    An autograder for one exercise also takes a single notebook whose name names no exercise
    (`homework (2).ipynb`). Every other upload is reported as not placed.
    """
    chosen, problems, used = {}, [], set()
    for exercise in expected:
        key = exercise_id(exercise.name)
        matches = [p for p in uploaded if exercise_id(p.name) == key]
        exact = [p for p in matches if p.name == f"{exercise.name}.ipynb"]
        used.update(matches)
        if len(exact) == 1 or len(matches) == 1:
            chosen[exercise.name] = (exact or matches)[0]
            others = [p.name for p in matches if p != chosen[exercise.name]]
            if others:
                problems.append(f"{exercise.name}: graded {chosen[exercise.name].name}; also uploaded, not "
                                f"graded: {', '.join(others[:5])}")
        elif matches:
            problems.append(f"{exercise.name}: {len(matches)} notebooks could be this exercise "
                            f"({', '.join(p.name for p in matches[:5])}); upload one, named "
                            f"{exercise.name}.ipynb")
        elif len(expected) == 1 and len(uploaded) == 1 and exercise_id(uploaded[0].name) is None:
            chosen[exercise.name] = uploaded[0]
            used.add(uploaded[0])
        elif len(expected) == 1 and len(uploaded) == 1:
            problems.append(f"{uploaded[0].name} is named as exercise {exercise_id(uploaded[0].name)}; this "
                            f"assignment is {exercise.name}: upload {exercise.name}.ipynb")
            used.add(uploaded[0])
    unplaced = [p.name for p in uploaded if p not in used]
    if unplaced:
        problems.append(f"not graded, named after no exercise of this assignment: {', '.join(unplaced[:5])}"
                        + (f" and {len(unplaced) - 5} more" if len(unplaced) > 5 else ""))
    if not uploaded:
        problems.append("no .ipynb notebook was uploaded")
    return chosen, problems


def copy_upload(path: Path, destination: Path) -> None:
    """Copy a regular file's bytes, refusing a link swapped in since it was listed."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "rb") as f:
        destination.write_bytes(f.read(MAX_UPLOAD_BYTES + 1))


def grade(root: Path, config: dict, expected: list[Expected], results_path: Path) -> dict:
    """Grade the upload; results.json is provisional first, then rewritten after each notebook."""
    start = time.monotonic()
    budget = float(config.get("total_seconds", DEFAULT_TOTAL_SECONDS))
    visibility = config["hidden_visibility"]
    chosen, problems = choose(notebooks(root / "submission"), expected)
    pending = {name: PENDING for name in chosen}
    write_results(results_json(expected, {}, visibility, problems, 0.0, pending), results_path)
    exercises = load_exercises(root / "source" / "solutions")
    sandboxed, isolation = True, choose_isolation()
    print(f"run_autograder: {isolation.summary()}")
    if not isolation.usable:
        if not config["allow_unsandboxed"]:
            print("run_autograder: refusing to run the submission (build the zip with --allow-unsandboxed to "
                  "grade without the sandbox; see INSTRUCTORS.md, 'Grading a large class')")
            return results_json(expected, {}, visibility, problems, time.monotonic() - start,
                                {e.name: NO_SANDBOX for e in expected})
        print("run_autograder: WARNING: grading WITHOUT the sandbox (--allow-unsandboxed)")
        sandboxed = False
    solutions = (root / "source" / "solutions").resolve()
    options = Options(timeout=float(config["timeout"]), sandboxed=sandboxed, solutions=solutions)
    graded = {}
    with tempfile.TemporaryDirectory(prefix="mpcourse-gradescope-") as scratch:
        copies = {}
        for name, path in chosen.items():
            copies[name] = Path(scratch) / f"{name}.ipynb"
            try:
                copy_upload(path, copies[name])
            except OSError as error:
                problems.append(f"{name}: could not read {path.name}: {error.strerror}")
                del copies[name], pending[name]
        plans = plan_exercises(exercises, [exercise_id(name) for name in copies], 1, options)
        for name, copy in copies.items():
            left = budget - (time.monotonic() - start)
            if left < MIN_SECONDS:
                pending[name] = OUT_OF_TIME
                continue
            for _, result in grade_paths([str(copy)], exercises, plans, options, 1, budget=left):
                if (result.error and "timed out" in result.error) or not result.graded:
                    result.notes.append(f"the autograder's total time ({budget:g} s) left this notebook "
                                        f"{left:.0f} s")
                graded[name] = result
                print(format_result(result), flush=True)
            del pending[name]
            write_results(results_json(expected, graded, visibility, problems,
                                       time.monotonic() - start, pending),
                          results_path)
    return results_json(expected, graded, visibility, problems, time.monotonic() - start, pending)


def check(root: Path, config: dict, expected: list[Expected]) -> int:
    """setup.sh --check: the solutions match the configuration, and a sandbox can be made (or may be
    skipped)."""
    exercises = {e.name: e for e in load_exercises(root / "source" / "solutions").values()}
    failures = 0
    for wanted in expected:
        got = exercises.get(wanted.name)
        tests = tuple((t.id, t.points) for t in got.tests) if got else None
        if tests != wanted.tests:
            print(f"setup.sh --check: {wanted.name}: the solution's tests {tests} differ from the "
                  f"configuration's {wanted.tests}")
            failures += 1
    isolation = choose_isolation()
    if isolation.usable:
        works = ("the bubblewrap sandbox works here" if isolation.kind != USER
                 else "the fallback sandbox works here")
        print(f"setup.sh --check: {works}; run_autograder will grade in this {isolation.summary()}")
        if isolation.kind == USER and not isolation.walls and not unreachable_by_others(root / "source"):
            print(f"setup.sh --check: {root / 'source'} is readable by other users, and without Landlock the "
                  "fallback sandbox's learner could read it: chmod -R go-rwx it")
            failures += 1
    elif config["allow_unsandboxed"]:
        print(f"setup.sh --check: WARNING: {isolation.summary()}; submissions will be graded unprotected")
    else:
        print(f"setup.sh --check: {isolation.summary()}; run_autograder will refuse to run submissions")
        failures += 1
    print(f"setup.sh --check: {len(expected)} exercise(s), {'ready' if not failures else 'NOT ready'}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_autograder", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/autograder", help="Gradescope's folder (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="check the installation; grade nothing")
    args = parser.parse_args(argv)
    root = Path(args.root)
    config, expected = read_config(root / "source")
    if args.check:
        return check(root, config, expected)
    results_path = root / "results" / "results.json"
    try:
        results = grade(root, config, expected, results_path)
    except Exception as error:  # the learner still gets results.json, and the instructor the traceback
        traceback.print_exc()
        results = results_json(expected, {}, config["hidden_visibility"],
                               [f"the autograder failed ({type(error).__name__}); your submission was "
                                "received and your instructor can see why"])
    write_results(results, results_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
