"""`mpcourse` as the grading tests run it: the same command, with each exercise's plan cached.

Before it grades, `mpcourse grade` plans each exercise: it runs the solution in a sandbox and
notes the tests it fails (`judge.calibrate`, about 4 CPU seconds). The test suite grades the same
solutions in one run after another, and a plan depends on nothing else than the solution, the
course's code and torch: so here it is kept, under a key made of those three, in the folder that
`PLAN_CACHE` names (tests/conftest.py makes one per test session, shared by pytest's workers).
Only successful plans are kept; a solution that could not be run is planned again next time.

The grader itself has no cache: tests/test_exercises.py grades through `mpcourse` unchanged, so
planning is tested uncached there. Run as `python tests/cached_plans.py grade ...` (`MPCOURSE`).
"""
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

import mpcourse
from mpcourse import cli
from mpcourse.grading import grader
from mpcourse.grading.instructor import class_run
from mpcourse.grading.judging.judge import Plan

PLAN_CACHE = "MPCOURSE_TEST_PLAN_CACHE"
MPCOURSE = [sys.executable, str(Path(__file__).resolve())]
PACKAGE = Path(mpcourse.__file__).resolve().parent


def code_digest() -> str:
    """The digest of the course's code (every module of the package: the solutions call it too)."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def plan_key(exercise, code: str) -> str:
    """The cache key of `exercise`'s plan: its solution as loaded, the code's digest, torch's version."""
    return hashlib.sha256("\0".join((repr(exercise), code, torch.__version__)).encode()).hexdigest()


def cached(plan_exercises, folder: Path):
    """`plan_exercises` that reads the plans it finds in `folder` and writes the ones it makes."""
    def plan(exercises, keys, jobs, options):
        code = code_digest()
        files = {key: folder / f"{plan_key(exercises[key], code)}.json" for key in set(keys)}
        found = {key: Plan(**json.loads(path.read_text())) for key, path in files.items() if path.exists()}
        made = plan_exercises(exercises, [key for key in keys if key not in found], jobs, options)
        for key, made_plan in made.items():
            if isinstance(made_plan, Plan):  # written whole or not at all: workers may read it meanwhile
                with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as out:
                    json.dump(dataclasses.asdict(made_plan), out)
                os.replace(out.name, files[key])
        return found | made
    return plan


if __name__ == "__main__":
    if os.environ.get(PLAN_CACHE):
        class_run.plan_exercises = cached(grader.plan_exercises, Path(os.environ[PLAN_CACHE]))
    sys.exit(cli.main())
