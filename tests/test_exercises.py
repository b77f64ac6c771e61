"""Every exercise end to end: each solution scores 100%, each learner copy as released scores 0."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from grading_budgets import backstop

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("ex*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("ex*.ipynb"))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    # graded as copies: the grader refuses a submission inside its solutions folder
    tmp = tmp_path_factory.mktemp("exercises")
    for folder, paths in (("solutions", SOLUTIONS), ("exercises", EXERCISES)):
        (tmp / folder).mkdir()
        for path in paths:
            shutil.copy(path, tmp / folder / path.name)
    paths = [str(tmp / p.parent.name / p.name) for p in SOLUTIONS + EXERCISES]
    result = subprocess.run([sys.executable, "-m", "mpcourse.cli", "grade", "--solutions", str(ROOT / "solutions"),
                             "--json", "--timeout", "300", "--", *paths],
                            capture_output=True, text=True, cwd=ROOT, timeout=backstop(paths, 300))
    assert result.returncode == 0, result.stderr
    return {Path(s["path"]).relative_to(tmp).as_posix(): s for s in json.loads(result.stdout)["submissions"]}


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_solution_scores_full_marks(graded, path):
    got = graded[f"solutions/{path.name}"]
    failed = {t["id"]: t["reason"] for t in got["tests"] if not t["passed"]}
    assert got["error"] is None and not failed, f"{path.name}: {got['error']} {failed}"
    assert got["score"] == got["max_score"] > 0


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_unchanged_exercise_scores_zero_without_crashing(graded, path):
    got = graded[f"exercises/{path.name}"]
    assert got["exercise"] == path.stem and got["max_score"] > 0
    assert got["score"] == 0, f"{path.name}: an untouched exercise earned points: {got['tests']}"
    assert all(t["reason"] for t in got["tests"]), "every failed test needs a reason"
    assert "timed out" not in (got["error"] or "") and "kernel died" not in (got["error"] or "")
