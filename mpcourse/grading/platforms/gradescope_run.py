"""What `run_autograder` runs in Gradescope's container: grade the submission, write results.json.

Gradescope's layout (gradescope/autograder_samples, docs/specs.md): the zip unpacked in
<root>/source, the learner's upload in <root>/submission, results in <root>/results/results.json,
and everything printed goes to the instructor only. The root is a parameter, so the tests lay
the same folders out in a temporary directory.

Each expected exercise's notebook is copied (a regular file, never a link, read once) under the
exercise's own name into a private scratch folder, so an upload called `homework (2).ipynb`
is graded too, and then graded by `grade_submission` in the bubblewrap sandbox, exactly as
`mpcourse grade` does. results.json is always written, whatever fails.
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

from mpcourse.grading.exercise import exercise_id
from mpcourse.grading.gradebook import format_result
from mpcourse.grading.grader import Options, grade_submission, load_exercises, plan_exercises
from mpcourse.grading.platforms.gradescope_results import Expected, results_json, write_results
from mpcourse.grading.sandbox import USER, choose_isolation, unreachable_by_others

CONFIG = "mpcourse-autograder.json"
MAX_UPLOAD_BYTES = 64 << 20  # larger notebooks are cut here; the grader refuses them anyway
NO_SANDBOX = ("The autograder could not start its sandbox, so your notebook was not run. Your instructor "
              "can see why; this score is not your grade.")


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
                  if name.endswith(".ipynb") and not name.startswith(".") and not (Path(top) / name).is_symlink()]
    return found


def choose(uploaded: list[Path], expected: list[Expected]) -> tuple[dict[str, Path], list[str]]:
    """The notebook to grade for each expected exercise, and what the learner should know.

    A notebook counts for an exercise when its name starts with the exercise's id (ex00...); one
    named exactly like the exercise wins over others. An autograder for one exercise also takes
    a single notebook whose name names no exercise (`homework (2).ipynb`).
    """
    chosen, problems = {}, []
    for exercise in expected:
        key = exercise_id(exercise.name)
        matches = [p for p in uploaded if exercise_id(p.name) == key]
        exact = [p for p in matches if p.name == f"{exercise.name}.ipynb"]
        if len(exact) == 1 or len(matches) == 1:
            chosen[exercise.name] = (exact or matches)[0]
        elif matches:
            problems.append(f"{exercise.name}: {len(matches)} notebooks could be this exercise "
                            f"({', '.join(p.name for p in matches[:5])}); upload one, named {exercise.name}.ipynb")
        elif len(expected) == 1 and len(uploaded) == 1 and exercise_id(uploaded[0].name) is None:
            chosen[exercise.name] = uploaded[0]
        elif len(expected) == 1 and len(uploaded) == 1:
            problems.append(f"{uploaded[0].name} is named as exercise {exercise_id(uploaded[0].name)}; this "
                            f"assignment is {exercise.name}: upload {exercise.name}.ipynb")
    if not uploaded:
        problems.append("no .ipynb notebook was uploaded")
    return chosen, problems


def copy_upload(path: Path, destination: Path) -> None:
    """Copy a regular file's bytes, refusing a link swapped in since it was listed."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "rb") as f:
        destination.write_bytes(f.read(MAX_UPLOAD_BYTES + 1))


def grade(root: Path, config: dict, expected: list[Expected]) -> dict:
    start = time.perf_counter()
    exercises = load_exercises(root / "source" / "solutions")
    sandboxed, isolation = True, choose_isolation()
    print(f"run_autograder: {isolation.summary()}")
    if not isolation.usable:
        if not config["allow_unsandboxed"]:
            print("run_autograder: refusing to run the submission (build the zip with --allow-unsandboxed to "
                  "grade without the sandbox; see INSTRUCTORS.md, 'Grading a large class')")
            return results_json(expected, {}, config["hidden_visibility"], [NO_SANDBOX])
        print("run_autograder: WARNING: grading WITHOUT the sandbox (--allow-unsandboxed)")
        sandboxed = False
    chosen, problems = choose(notebooks(root / "submission"), expected)
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
                del copies[name]
        keys = [exercise_id(name) for name in copies]
        plans = plan_exercises(exercises, keys, 1, options)
        for name, copy in copies.items():
            graded[name] = grade_submission(copy, exercises, plans, options)
            print(format_result(graded[name]), flush=True)
    return results_json(expected, graded, config["hidden_visibility"], problems, time.perf_counter() - start)


def check(root: Path, config: dict, expected: list[Expected]) -> int:
    """setup.sh --check: the solutions match the configuration, and a sandbox can be made (or may be skipped)."""
    exercises = {e.name: e for e in load_exercises(root / "source" / "solutions").values()}
    failures = 0
    for wanted in expected:
        got = exercises.get(wanted.name)
        tests = tuple((t.id, t.points) for t in got.tests) if got else None
        if tests != wanted.tests:
            print(f"setup.sh --check: {wanted.name}: the solution's tests {tests} differ from the configuration's "
                  f"{wanted.tests}")
            failures += 1
    isolation = choose_isolation()
    if isolation.usable:
        works = "the bubblewrap sandbox works here" if isolation.kind != USER else "the fallback sandbox works here"
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
    try:
        results = grade(root, config, expected)
    except Exception as error:  # the learner still gets results.json, and the instructor the traceback
        traceback.print_exc()
        results = results_json(expected, {}, config["hidden_visibility"],
                               [f"the autograder failed ({type(error).__name__}); your instructor can see why"])
    write_results(results, root / "results" / "results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
