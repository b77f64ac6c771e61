"""`mpcourse autograder github-classroom`: a workflow that runs the visible tests in a learner's repository.

The files follow GitHub Classroom's autograding format: the workflow "Autograding Tests" with
one job `run-autograding-tests`, one `classroom-resources/autograding-command-grader@v1` step
per test (points awarded when its command exits 0) and `autograding-grading-reporter@v1`
summing them (that action's README, and the reporter's `notify-classroom.js`); plus the older
`.github/classroom/autograding.json` list of tests. GitHub retired the Classroom service on
2026-08-28; the workflow still runs as ordinary GitHub Actions and reports "Points x/y".

Only the visible tests run there. Everything a workflow reads in a learner's repository, the
learner can read too (they can push a workflow that prints it), so hidden tests, the solutions
and the reference runs the grader needs stay with the instructor: grade those with
`mpcourse grade` or Gradescope. For the same reason the points here can be forged by a learner
who edits the workflow or the tests; treat them as feedback, not as the grade.

`python -m mpcourse.grading.platforms.classroom NOTEBOOK TEST_ID` is each step's command: it runs
the learner's notebook once (cached by its bytes), its `check()` results, and exits 0 when the
test passed.

The install step uses the course's lock and the torch it was resolved with (`TORCH_SPEC`, the
Makefile's LOCKED_TORCH, CPU wheels), so the learner's run uses the versions the course was
tested with. `--exercises` is a path inside the course's repository, resolved from the course's
root (the nearest folder upwards holding pyproject.toml, else the checkout mpcourse is imported
from), wherever the command is run.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import nbformat
import yaml

from mpcourse.grading.judging.exercise import has_code, is_check_cell, is_test_cell, visible

WORKFLOW_NAME, JOB = "Autograding Tests", "run-autograding-tests"  # the names Classroom looks for
COMMAND_GRADER = "classroom-resources/autograding-command-grader@v1"
REPORTER = "classroom-resources/autograding-grading-reporter@v1"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
LOCK_FILE = "requirements-lock.txt"  # the course's lock, in the learner's copy of the repository
CACHE = Path(".mpcourse-classroom")
INSTALL = f"""if [ -f {LOCK_FILE} ]; then
  python -m pip install --require-hashes -r {LOCK_FILE}
  python -m pip install --index-url {TORCH_INDEX} "${{TORCH_SPEC:-torch}}"
  python -m pip install --no-deps -e .
else
  python -m pip install --index-url {TORCH_INDEX} "${{TORCH_SPEC:-torch}}"
  python -m pip install -e .
fi"""


def visible_tests(notebook: str | Path) -> list[tuple[str, float]]:
    """The (id, points) of a learner notebook's tests that have visible code."""
    nb = nbformat.read(notebook, as_version=4)
    return [(cell.metadata["nbgrader"]["grade_id"], float(cell.metadata["nbgrader"]["points"]))
            for cell in nb.cells if is_test_cell(cell) and has_code(visible(cell.source))]


def step_id(exercise: str, test_id: str) -> str:
    """A step id Actions accepts (letters, digits, - and _, starting with a letter)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", f"{exercise[:4]}-{test_id}").strip("-").lower()


def find_course_root(start: str | Path = ".") -> Path:
    """The nearest folder at or above `start` holding pyproject.toml (the course repository's root);
    outside any, the checkout `mpcourse` is imported from."""
    from mpcourse.grading.platforms.gradescope_zip import course_root
    here = Path(start).resolve()
    return next((folder for folder in (here, *here.parents) if (folder / "pyproject.toml").is_file()), None) \
        or course_root()


def workflow(exercises: str | Path, timeout_minutes: int = 10,
             root: str | Path | None = None) -> tuple[dict, dict]:
    """The workflow and the classroom config for every exercise notebook in `exercises`.

    `exercises` is resolved from the course's root (`root`, or the one above the current folder);
    paths in the commands are relative to that root, as the learner's repository lays them out.
    """
    from mpcourse.grading.platforms.gradescope_zip import locked_torch
    root = Path(root).resolve() if root else find_course_root()
    folder = (root / exercises).resolve()
    if not folder.is_relative_to(root):
        raise ValueError(f"--exercises {str(exercises)!r} lies outside the course's root {str(root)!r}")
    notebooks = sorted(folder.glob("ex[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise ValueError(f"no exercise notebooks (exNN_*.ipynb) in {str(folder)!r}: pass --exercises DIR, "
                         f"a folder of the course's root {str(root)!r}")
    folder = folder.relative_to(root)
    steps = [{"name": "Checkout code", "uses": "actions/checkout@v4"},
             {"name": "Set up Python", "uses": "actions/setup-python@v5", "with": {"python-version": "3.11"}},
             {"name": "Install the course", "env": {"TORCH_SPEC": locked_torch(root)}, "run": INSTALL}]
    config, runners = {"tests": []}, []
    for notebook in notebooks:
        for test_id, points in visible_tests(notebook):
            ident = step_id(notebook.stem, test_id)
            command = (f"python -m mpcourse.grading.platforms.classroom "
                       f"{(folder / notebook.name).as_posix()} {test_id}")
            score = int(points) if points == int(points) else points
            steps.append({"name": f"{notebook.stem}: {test_id}", "id": ident, "uses": COMMAND_GRADER,
                          "with": {"test-name": f"{notebook.stem}: {test_id}", "setup-command": "",
                                   "command": command, "timeout": timeout_minutes, "max-score": score}})
            config["tests"].append({"name": f"{notebook.stem}: {test_id}", "setup": "",
                                    "run": command, "input": "",
                                    "output": "", "comparison": "included", "timeout": timeout_minutes,
                                    "points": score})
            runners.append(ident)
    steps.append({"name": "Autograding Reporter", "uses": REPORTER,
                  "env": {f"{ident.upper()}_RESULTS": f"${{{{steps.{ident}.outputs.result}}}}"
                          for ident in runners},
                  "with": {"runners": ",".join(runners)}})
    # GitHub Classroom's template lists the events; a mapping triggers the same and passes actionlint,
    # which refuses repository_dispatch in a list
    flow = {"name": WORKFLOW_NAME, "on": {"push": None, "workflow_dispatch": None,
                                          "repository_dispatch": None},
            "permissions": {"checks": "write", "actions": "read", "contents": "read"},
            "jobs": {JOB: {"runs-on": "ubuntu-latest", "if": "github.actor != 'github-classroom[bot]'",
                           "steps": steps}}}
    return flow, config


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (the install script) as literal blocks, as a person writes them."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def write_classroom(exercises: str | Path, out: str | Path | None, timeout_minutes: int = 10,
                    root: str | Path | None = None) -> list[Path]:
    """Write .github/workflows/classroom.yml and .github/classroom/autograding.json under `out`
    (the course's root when None)."""
    root = Path(root).resolve() if root else find_course_root()
    flow, config = workflow(exercises, timeout_minutes, root)
    out = root if out is None else out
    workflow_path = Path(out) / ".github" / "workflows" / "classroom.yml"
    config_path = Path(out) / ".github" / "classroom" / "autograding.json"
    for path in (workflow_path, config_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    workflow_path.write_text("# Written by `mpcourse autograder github-classroom`: the visible tests only.\n"
                             + yaml.dump(flow, Dumper=_Dumper, sort_keys=False, width=120))
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return [workflow_path, config_path]


def run_visible_tests(notebook: Path) -> dict[str, dict]:
    """Run the learner's code cells in an IPython shell, then `check()`: {test id: {passed, reason}}."""
    from IPython.core.interactiveshell import InteractiveShell

    from mpcourse.grading.judging.selfcheck import check
    shell = InteractiveShell.instance()
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type == "code" and not is_test_cell(cell) and not is_check_cell(cell):
            shell.run_cell(cell.source, store_history=True, silent=False)
    return {r.id: {"passed": r.passed, "reason": r.reason} for r in check(notebook).results}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m mpcourse.grading.platforms.classroom NOTEBOOK TEST_ID", file=sys.stderr)
        return 2
    notebook, test_id = Path(argv[0]), argv[1]
    digest = hashlib.sha256(notebook.read_bytes()).hexdigest()
    cached = CACHE / f"{notebook.stem}.json"
    results = json.loads(cached.read_text()) if cached.is_file() else {}
    if results.get("sha256") != digest:
        results = {"sha256": digest, "tests": run_visible_tests(notebook)}
        CACHE.mkdir(exist_ok=True)
        cached.write_text(json.dumps(results))
    if test_id not in results["tests"]:
        print(f"{notebook}: no visible test {test_id!r}; its tests: {', '.join(results['tests'])}",
              file=sys.stderr)
        return 2
    outcome = results["tests"][test_id]
    print(f"{test_id}: {'pass' if outcome['passed'] else 'FAIL'}  {outcome['reason'] or ''}")
    return 0 if outcome["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
