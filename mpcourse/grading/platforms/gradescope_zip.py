"""`mpcourse autograder gradescope`: a Gradescope autograder zip for one exercise, several, or all.

The zip holds, at its root (Gradescope's "Autograder Specifications", gradescope/autograder_samples
docs/specs.md): `setup.sh`, which Gradescope runs once as root to build the image, and
`run_autograder`, which it runs for every submission in /autograder. Beside them: the chosen
solution notebooks (hidden tests included: learners never see the zip), the course package to
install, the lock file of its dependencies when the course has one, and `mpcourse-autograder.json`
saying what to grade. In the container `run_autograder` calls `gradescope_run`, which grades with
the same functions as `mpcourse grade`, in the same sandbox: bubblewrap where the container lets it
make namespaces, else the fallback (an unprivileged user per submission, `isolation.choose_isolation`).
"""
from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import nbformat

import mpcourse
from mpcourse.grading.judging.exercise import BEGIN_HIDDEN, is_test_cell
from mpcourse.grading.grader import load_exercises
from mpcourse.grading.platforms.gradescope_results import HIDDEN_CHOICES
from mpcourse.grading.platforms.gradescope_run import DEFAULT_TOTAL_SECONDS

CONFIG = "mpcourse-autograder.json"
LOCK_FILE = "requirements-lock.txt"  # the course's locked dependencies (with hashes), beside pyproject.toml
COURSE_FILES = ("pyproject.toml", "README.md", LOCK_FILE)
EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed zip timestamps: the same inputs give the same bytes

SETUP_SH = r'''#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
#   setup.sh           install Python, the locked dependencies, torch, the course and bubblewrap
#   setup.sh --check   install nothing; say whether everything run_autograder needs is there, and
#                      which sandbox it will grade in (exit 0 when bubblewrap or the fallback works)
# AUTOGRADER_ROOT (default /autograder) and MPCOURSE_PYTHON (default the venv below) let a test
# lay out Gradescope's folders anywhere. The order is the Makefile's: the lock, then torch, then
# the course without dependencies.
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
VENV="$ROOT/venv"
PYTHON="${MPCOURSE_PYTHON:-$VENV/bin/python}"
LOCK="$SOURCE/course/requirements-lock.txt"  # the locked dependencies; the one place this script names them
TORCH_SPEC="${TORCH_SPEC:-@TORCH_SPEC@}"  # the torch the lock was resolved with (the Makefile's LOCKED_TORCH)
# CPU wheels: PyPI's Linux torch is a CUDA build
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"

check() {
  "$PYTHON" -I -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null \
    || { echo "setup.sh --check: $PYTHON is missing or older than Python 3.10"; return 1; }
  "$PYTHON" -I -m mpcourse.grading.platforms.gradescope_run --root "$ROOT" --check
}

if [ "${1:-}" = "--check" ]; then
  check
  exit $?
fi

set -e
export DEBIAN_FRONTEND=noninteractive
apt-get update
# bubblewrap is the grader's sandbox where the container allows namespaces; where Docker's seccomp
# profile refuses them, run_autograder grades in the fallback: each submission as an unprivileged
# user, walled in by Landlock where the kernel has it, with the source and results kept root's.
apt-get install -y --no-install-recommends bubblewrap python3-venv python3-pip
if apt-get install -y --no-install-recommends python3.11 python3.11-venv; then
    BASE=python3.11
else
    BASE=python3
fi
"$BASE" -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip
if [ -f "$LOCK" ]; then
  "$VENV/bin/pip" install --require-hashes -r "$LOCK"
else
  echo "setup.sh: no lock file in this zip; installing the course's declared (unpinned) dependencies"
fi
"$VENV/bin/pip" install --index-url "$TORCH_INDEX" "$TORCH_SPEC"
if [ -f "$LOCK" ]; then
  "$VENV/bin/pip" install --no-deps "$SOURCE/course"
else
  "$VENV/bin/pip" install "$SOURCE/course"
fi
chmod -R go-rwx "$SOURCE"  # the solutions and hidden tests: readable by root alone
mkdir -p "$ROOT/results" && chmod 700 "$ROOT/results"  # results.json: written and read by root alone
set +e
check
'''

RUN_AUTOGRADER = r'''#!/usr/bin/env bash
# Gradescope runs this for every submission, as root. It grades /autograder/submission/*.ipynb
# and always writes /autograder/results/results.json (AUTOGRADER_ROOT moves /autograder).
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${MPCOURSE_PYTHON:-$ROOT/venv/bin/python}"
cd "$ROOT" || exit 1
mkdir -p "$ROOT/results" && chmod 700 "$ROOT/results"  # no submission's uid may reach results.json
exec "$PYTHON" -I -m mpcourse.grading.platforms.gradescope_run --root "$ROOT"
'''


def hidden_test_ids(solution: Path) -> list[str]:
    """The ids of a solution's tests that hold hidden lines."""
    nb = nbformat.read(solution, as_version=4)
    return [cell.metadata["nbgrader"]["grade_id"] for cell in nb.cells
            if is_test_cell(cell) and any(line.strip() == BEGIN_HIDDEN for line in cell.source.splitlines())]


def locked_torch(root: Path) -> str:
    """The torch requirement the lock was resolved with: the Makefile's LOCKED_TORCH, else any torch."""
    makefile = root / "Makefile"
    found = re.search(r"^LOCKED_TORCH\s*:?=\s*(\S+)", makefile.read_text(),
                      re.M) if makefile.is_file() else None
    return f"torch=={found.group(1)}" if found else "torch"


def course_root() -> Path:
    """The checkout `mpcourse` is imported from (the zip installs this copy of the course)."""
    root = Path(mpcourse.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        raise ValueError(f"mpcourse is imported from {root}, which is not a course checkout (no "
                         "pyproject.toml); run this command from the course's repository with its package "
                         "installed in editable mode")
    return root


def build_autograder(solutions: str | Path, out: str | Path, exercises: list[str] | None = None,
                     hidden_visibility: str = "after_published", timeout: float = 120.0,
                     allow_unsandboxed: bool = False, total_seconds: float = DEFAULT_TOTAL_SECONDS) -> dict:
    """Write the Gradescope autograder zip `out` for `exercises` (ids or names; None: all of them).

    `total_seconds` bounds a whole run of `run_autograder`: set it below the autograder timeout of
    the assignment's Gradescope settings, so results.json is final before Gradescope stops it.
    Returns the configuration written into the zip.
    """
    if hidden_visibility not in HIDDEN_CHOICES:
        raise ValueError(f"--hidden-visibility must be one of {', '.join(HIDDEN_CHOICES)}, got "
                         f"{hidden_visibility!r}")
    if not timeout > 0:
        raise ValueError(f"--timeout must be positive, got {timeout}")
    if not total_seconds > 0:
        raise ValueError(f"--total-seconds must be positive, got {total_seconds}")
    solutions = Path(solutions)
    loaded = load_exercises(solutions)  # every solution parses, tests and points included
    by_name = {exercise.name: key for key, exercise in loaded.items()}
    keys = sorted(loaded) if not exercises else [by_name.get(wanted, wanted) for wanted in exercises]
    unknown = [wanted for wanted, key in zip(exercises or [], keys) if key not in loaded]
    if unknown:
        raise ValueError(f"no solution for {', '.join(map(repr, unknown))} in {str(solutions)!r}; "
                         f"known: {', '.join(sorted(by_name))}")
    chosen = [loaded[key] for key in dict.fromkeys(keys)]
    config = {"format": 1, "hidden_visibility": hidden_visibility, "timeout": timeout,
              "total_seconds": total_seconds,
              "allow_unsandboxed": allow_unsandboxed,
              "exercises": [{"name": e.name, "tests": [[t.id, t.points] for t in e.tests],
                             "hidden": hidden_test_ids(solutions / f"{e.name}.ipynb")} for e in chosen]}
    root = course_root()
    package = Path(mpcourse.__file__).resolve().parent
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        _add(zf, "setup.sh", SETUP_SH.replace("@TORCH_SPEC@", locked_torch(root)), executable=True)
        _add(zf, "run_autograder", RUN_AUTOGRADER, executable=True)
        _add(zf, CONFIG, json.dumps(config, indent=1) + "\n")
        for exercise in chosen:
            _add(zf, f"solutions/{exercise.name}.ipynb", (solutions / f"{exercise.name}.ipynb").read_bytes())
        for name in COURSE_FILES:
            if (root / name).is_file():
                _add(zf, f"course/{name}", (root / name).read_bytes())
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                _add(zf, f"course/mpcourse/{path.relative_to(package).as_posix()}", path.read_bytes())
    return config


def _add(zf: zipfile.ZipFile, name: str, data, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
