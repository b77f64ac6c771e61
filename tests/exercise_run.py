"""One graded run for the three exercise test files, instead of one each.

tests/test_exercises.py (every solution and released exercise), tests/test_exercise_predictions.py
and tests/test_ex11_prediction.py (submissions built from the released exercises) each write
their submissions with a `submissions(folder)` function; the first of them to need a result
grades them all in one `mpcourse grade` run, and the others read its results. pytest's workers
share the run through a file in their common temporary folder, under a lock. The run is the
grader as an instructor runs it: `python -m mpcourse.cli`, its plans made afresh (not
tests/cached_plans.py), so planning itself is tested here.
"""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from filelock import FileLock
from grading_budgets import backstop

ROOT = Path(__file__).resolve().parents[1]
FILES = ("test_exercises", "test_exercise_predictions", "test_ex11_prediction")
TIMEOUT = 300  # --timeout: CPU seconds per budget, far above any solution's work


def graded_exercises(tmp_path_factory, name: str) -> dict[str, dict]:
    """The results of the test file `name`'s submissions (one of FILES), by their paths relative to
    the folder its `submissions` wrote them into."""
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    results = root / "exercise-run.json"
    with FileLock(str(root / "exercise-run.lock")):
        if not results.exists():
            graded = _grade_all(root / "exercise-run")
            results.with_suffix(".part").write_text(json.dumps(graded))
            results.with_suffix(".part").replace(results)
    prefix = f"{name}/"
    return {path.removeprefix(prefix): result for path, result in json.loads(results.read_text()).items()
            if path.startswith(prefix)}


def _grade_all(folder: Path) -> dict[str, dict]:
    """Every file's submissions, written and graded in one run."""
    paths = []
    for name in FILES:
        (folder / name).mkdir(parents=True, exist_ok=True)
        paths += [str(p) for p in importlib.import_module(name).submissions(folder / name)]
    done = subprocess.run([sys.executable, "-m", "mpcourse.cli", "grade", "--solutions", str(ROOT / "solutions"),
                           "--json", "--timeout", str(TIMEOUT), "--jobs", "2", "--", *paths],
                          capture_output=True, text=True, cwd=ROOT, timeout=backstop(paths, TIMEOUT, jobs=2))
    assert done.returncode == 0, done.stderr[-3000:]
    return {Path(s["path"]).relative_to(folder).as_posix(): s for s in json.loads(done.stdout)["submissions"]}
