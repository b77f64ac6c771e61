"""Every exercise end to end: each solution scores 100%, each learner copy as released scores 0.

Graded with the prediction tests' submissions in one run, with the grader's own planning
(tests/exercise_run.py)."""
import shutil
from pathlib import Path

import pytest
from exercise_run import graded_exercises

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("ex*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("ex*.ipynb"))


def submissions(folder: Path) -> list[Path]:
    """Copies of every solution and released exercise, in `folder`'s solutions/ and exercises/ (the
    grader refuses a submission inside its solutions folder). tests/exercise_run.py grades them."""
    copies = []
    for name, paths in (("solutions", SOLUTIONS), ("exercises", EXERCISES)):
        (folder / name).mkdir()
        copies += [Path(shutil.copy(path, folder / name / path.name)) for path in paths]
    return copies


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return graded_exercises(tmp_path_factory, "test_exercises")


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
