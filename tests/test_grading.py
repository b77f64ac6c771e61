"""The exercise pipeline: release, the learner's check(), and the grader against hostile submissions."""
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch

from mpcourse.grading import selfcheck as check_module
from mpcourse.grading.exercise import HIDDEN_NOTE, load_exercise
from mpcourse.grading.release import release_all, release_notebook

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"


def _mpcourse(*args, env=None):
    return subprocess.run([sys.executable, "-m", "mpcourse.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)


def _test_cell(source, grade_id="t", points=1):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "points": points}
    return cell


def test_exercises_folder_is_exactly_what_release_writes(tmp_path):
    written = release_all(ROOT / "solutions", tmp_path)
    assert written, "no solutions found"
    assert sorted(p.name for p in written) == sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb")), \
        "exercises/ and solutions/ hold different notebooks: run `make release`"
    for fresh in written:
        committed = (ROOT / "exercises" / fresh.name).read_text()
        assert committed == fresh.read_text(), f"exercises/{fresh.name} drifted from its solution: run `make release`"


def test_release_stubs_solutions_at_their_indent_hides_tests_and_clears_outputs():
    code = nbformat.v4.new_code_cell("def f(x):\n    '''doc'''\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION")
    code.outputs = [nbformat.v4.new_output("stream", text="hi")]
    code.execution_count = 3
    test = _test_cell("assert f(1) == 2\n### BEGIN HIDDEN TESTS\nassert f(2) == 3\n### END HIDDEN TESTS")
    released = release_notebook(nbformat.v4.new_notebook(cells=[code, test]), "ex99_demo")
    assert released.cells[0].source == ("def f(x):\n    '''doc'''\n    # YOUR CODE HERE\n"
                                        "    raise NotImplementedError()")
    assert released.cells[0].outputs == [] and released.cells[0].execution_count is None
    assert released.cells[1].source == f"assert f(1) == 2\n{HIDDEN_NOTE}"
    assert released.metadata["mpcourse"] == {"exercise": "ex99_demo"}


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without a matching"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside another region"),
])
def test_unbalanced_solution_markers_are_reported(source, problem):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    with pytest.raises(ValueError, match=problem):
        release_notebook(nb, "ex99_bad")


def test_test_cells_need_an_id_and_positive_points(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[_test_cell("assert True", grade_id="t", points=0)])
    nbformat.write(nb, tmp_path / "ex99_bad.ipynb")
    with pytest.raises(ValueError, match="positive points"):
        load_exercise(tmp_path / "ex99_bad.ipynb")


def _check_with(monkeypatch, namespace):
    monkeypatch.setattr(check_module, "_shell", lambda: SimpleNamespace(user_ns=namespace))
    return check_module.check(ROOT / "exercises" / "ex00_bytes.ipynb")


def test_check_scores_the_learners_definitions_on_visible_tests(monkeypatch):
    right = lambda numel, dtype: numel * torch.empty((), dtype=dtype).element_size()
    score = _check_with(monkeypatch, {"torch": torch, "tensor_bytes": right})
    assert [r.passed for r in score.results] == [True, True, True]
    assert (score.score, score.max_score, score.hidden_points) == (3, 3, 1)
    assert "3/3" in repr(score) and "hidden tests worth 1 more point" in repr(score)


def test_check_shows_the_assertion_message_as_the_hint(monkeypatch):
    score = _check_with(monkeypatch, {"torch": torch, "tensor_bytes": lambda numel, dtype: numel * 4})
    assert [r.passed for r in score.results] == [True, False, False]
    assert score.results[1].reason == "10M float16 elements take 2 bytes each = 20,000,000 bytes, got 40000000"
    assert score.score == 1 and "fail" in score._repr_html_()


def test_check_without_definitions_fails_every_test_with_a_reason(monkeypatch):
    score = _check_with(monkeypatch, {"torch": torch})
    assert score.score == 0
    assert all(r.reason == "NameError: name 'tensor_bytes' is not defined" for r in score.results)


# Each hostile or broken submission gets a score and a one-line reason, and grading goes on.
EXPECTED = {
    "ex00_correct": (4, None),
    "ex00_partial": (1, None),
    "ex00_syntax_error": (0, "SyntaxError"),
    "ex00_raises": (0, "a code cell raised ValueError: I gave up"),
    "ex00_endless_loop": (0, "timed out"),
    "ex00_sys_exit": (4, "SystemExit: bye"),
    "ex00_os_exit": (0, "kernel died"),
    "ex00_replaces_grading": (0, "replaced mpcourse.grading.check"),
    "ex00_deletes_helpers": (0, "deleted builtins.AssertionError"),
    "ex00_patches_torch": (0, "replaced torch.Tensor.nbytes"),
    "ex00_prints_megabytes": (4, None),
    "ex00_trains_a_model": (4, None),  # building an optimizer loads torch._dynamo: not tampering
    "ex00_sabotage": (0, None),
    "ex00_not_a_notebook": (0, "not a valid .ipynb"),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grading")
    solutions = tmp / "solutions"
    shutil.copytree(ROOT / "solutions", solutions)
    env = dict(os.environ, MPCOURSE_SABOTAGE_TARGET=str(solutions / "ex00_bytes.ipynb"))
    # the saboteur goes first and the partial answer last, so a successful sabotage would show
    paths = [FIXTURES / "ex00_sabotage.ipynb"] + sorted(
        p for p in FIXTURES.glob("*.ipynb") if p.stem not in ("ex00_sabotage", "ex00_partial")) + \
        [FIXTURES / "ex00_partial.ipynb"]
    result = _mpcourse("grade", *map(str, paths), "--solutions", str(solutions), "--timeout", "20",
                       "--jobs", "2", "--json", "--csv", str(tmp / "grades.csv"), env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "pass  # " in (solutions / "ex00_bytes.ipynb").read_text(), "the saboteur did not get to run"
    return {Path(s["path"]).stem: s for s in report["submissions"]}, tmp / "grades.csv"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_submission_gets_expected_score_and_reason(graded, name):
    submissions, _ = graded
    score, reason = EXPECTED[name]
    got = submissions[name]
    assert got["score"] == score, got
    assert got["max_score"] == 4 and got["exercise"] == "ex00_bytes"
    if reason is None:
        assert got["error"] is None, got["error"]
    else:
        assert reason in (got["error"] or ""), got["error"]
    assert len(got["tests"]) == 4
    for test in got["tests"]:
        assert test["passed"] == (test["points"] == test["max_points"])
        assert test["passed"] or test["reason"], f"{name}: a failed test needs a reason"


def test_failing_tests_say_why(graded):
    submissions, _ = graded
    assert submissions["ex00_raises"]["tests"][0]["reason"] == "ValueError: I gave up"
    partial = {t["id"]: t for t in submissions["ex00_partial"]["tests"]}
    assert partial["fp32_ten_million"]["passed"] and not partial["fp16_ten_million"]["passed"]
    assert "20,000,000" in partial["fp16_ten_million"]["reason"]


def test_gradebook_has_a_row_per_submission_and_test(graded):
    submissions, gradebook = graded
    rows = list(csv.DictReader(gradebook.open()))
    assert len(rows) == 4 * len(EXPECTED)
    correct = [r for r in rows if Path(r["path"]).stem == "ex00_correct"]
    assert {r["test"] for r in correct} == {"fp32_ten_million", "fp16_ten_million", "bf16_matches_torch",
                                            "any_size_matches_torch"}
    assert all(r["passed"] == "True" and r["score"] == "4.0" for r in correct)


def test_grade_rejects_a_missing_solutions_folder(tmp_path):
    result = _mpcourse("grade", str(FIXTURES / "ex00_correct.ipynb"), "--solutions", str(tmp_path))
    assert result.returncode == 2 and "no solution notebooks" in result.stderr
