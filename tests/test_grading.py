"""The exercise pipeline: release, the learner's check(), and the grader against hostile submissions.

The hostile submissions and the score each must get are in tests/fixtures/submissions (MANIFEST.json,
written by build_fixtures.py there). They are graded once, in the sandbox, the load-sensitive ones
(MANIFEST.json's `load_sensitive`) in a second run beside two CPU hogs; the tests then check the
scores, the reasons, the gradebooks, and that nothing outside the sandbox changed or survived.
"""
import csv
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch

from cpu_hogs import cpu_hogs, stop
from cached_plans import MPCOURSE
from grading_budgets import backstop, sandbox_processes, submission_budget
from mpcourse.grading import gradebook
from mpcourse.grading.judging import checkable, codec
from mpcourse.grading.judging import selfcheck as check_module
from mpcourse.grading.judging.exercise import (BEGIN_HIDDEN, END_HIDDEN, HIDDEN_NOTE, check_line, is_check_cell,
                                                load_exercise)
from mpcourse.grading.judging.release import release_all, release_notebook
from mpcourse.grading.sandbox.limits import Budget

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"


def _mpcourse(*args, env=None, timeout=60.0, jobs=1):
    """`mpcourse grade ...` with `--timeout TIMEOUT --jobs JOBS`, waited for as long as the
    grader's own backstops allow."""
    paths = [a for a in args if str(a).endswith(".ipynb")]
    return subprocess.run([*MPCOURSE, *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=backstop(paths, timeout, jobs))


def _test_cell(source, grade_id="t", points=1):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "points": points}
    return cell


def test_exercises_folder_is_exactly_what_release_writes(tmp_path):
    """Both copies release writes: the learner's notebooks in exercises/, and the visible tests
    the package ships for check() (mpcourse/grading/visible_tests)."""
    written = release_all(ROOT / "solutions", tmp_path / "exercises", tmp_path / "visible_tests")
    assert written, "no solutions found"
    for folder, committed_folder in (("exercises", ROOT / "exercises"), ("visible_tests", checkable.SHIPPED)):
        fresh = sorted(p for p in written if p.parent.name == folder)
        assert fresh and [p.name for p in fresh] == sorted(p.name for p in committed_folder.glob("ex*")), \
            f"{committed_folder} and solutions/ hold different exercises: run `make release`"
        for path in fresh:
            assert (committed_folder / path.name).read_text() == path.read_text(), \
                f"{committed_folder / path.name} drifted from its solution: run `make release`"


def test_release_outside_a_course_checkout_asks_where_the_visible_tests_go(tmp_path):
    """By default the package's copy goes beside the solutions folder, into the course's package:
    where there is none, release says so instead of making one up."""
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    with pytest.raises(ValueError, match=r"mpcourse/grading is not the course's package.*--visible-tests"):
        release_all(tmp_path / "solutions", tmp_path / "exercises")
    assert not (tmp_path / "mpcourse").exists()


def test_the_shipped_tests_hold_no_hidden_line():
    """Hidden tests never ship: no line of a hidden block that the learner's copy does not also
    show is in the package's visible tests (a shipped file is readable by every learner)."""
    hidden_lines = 0
    for path in sorted((ROOT / "solutions").glob("ex*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        shown = "\n".join(c.source for c in nbformat.read(ROOT / "exercises" / path.name, as_version=4).cells)
        blocks = [block.split(END_HIDDEN)[0] for c in cells for block in c.source.split(BEGIN_HIDDEN)[1:]]
        secret = {line.strip() for block in blocks for line in block.splitlines()} - {""}
        secret = {line for line in secret if line not in shown}
        hidden_lines += len(secret)
        packaged = checkable.shipped(path.stem)
        text = "\n".join((*packaged.setup, *(t.source for t in packaged.tests), *packaged.answers))
        leaked = [line for line in secret if line in text]
        assert not leaked, f"{path.stem}: hidden test lines ship in the package: {leaked[:3]}"
    assert hidden_lines > 20, "the solutions' hidden tests were not found: the test would prove nothing"


def test_the_package_ships_every_exercise_as_released():
    """The package's copy is what check() reads from each released notebook, and the check()
    cell release wrote names the exercise and that copy's fingerprint."""
    for path in sorted((ROOT / "exercises").glob("ex*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        from_file = checkable.from_notebook(nb, path.stem)
        assert checkable.shipped(path.stem) == from_file
        assert nb.cells[-1].source == check_line(path.stem, from_file.fingerprint)


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
    assert released.metadata["mpcourse"] == {"exercise": "ex99_demo", "answers": ["f"], "setup": []}


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


def _released_call(name):
    """The (exercise, release) arguments of a released notebook's check() cell, as the kernel gets them."""
    call = nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4).cells[-1].source
    exercise, release = re.fullmatch(r'.*check\("([^"]+)", release="([^"]+)"\)', call).groups()
    return exercise, release


@pytest.fixture
def nowhere(monkeypatch, tmp_path):
    """A kernel as Colab's: its working folder holds no notebook, and Jupyter names none."""
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("answer, passed", [
    (lambda numel, dtype: numel * torch.empty((), dtype=dtype).element_size(), [True, True, True]),
    (lambda numel, dtype: numel * 4, [True, False, False]),
])
def test_check_without_the_file_shows_the_table_the_file_shows(monkeypatch, nowhere, answer, passed):
    namespace = {"torch": torch, "tensor_bytes": answer}
    from_file = _check_with(monkeypatch, namespace)
    without = check_module.check(*_released_call("ex00_bytes"))
    assert [r.passed for r in without.results] == passed
    assert without == from_file and repr(without) == repr(from_file)


def test_check_reads_the_file_where_the_kernel_finds_it(monkeypatch, nowhere):
    """A notebook of the named exercise in the working folder is the one checked (here, one whose
    visible test a learner edited: its hint shows), as in nbval and JupyterLab."""
    nb = nbformat.read(ROOT / "exercises" / "ex00_bytes.ipynb", as_version=4)
    (test,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "fp16_ten_million"]
    test.source = 'assert tensor_bytes(1, torch.float16) == 3, "edited in this copy"'
    nbformat.write(nb, nowhere / "my copy of ex00.ipynb")
    monkeypatch.setattr(check_module, "_shell", lambda: SimpleNamespace(user_ns={"torch": torch, "tensor_bytes": (
        lambda numel, dtype: numel * torch.empty((), dtype=dtype).element_size())}))
    score = check_module.check(*_released_call("ex00_bytes"))
    assert {r.id: r.reason for r in score.results}["fp16_ten_million"] == "edited in this copy"
    (nowhere / "my copy of ex00.ipynb").unlink()
    assert all(r.passed for r in check_module.check(*_released_call("ex00_bytes")).results)


@pytest.mark.parametrize("call, says", [
    (("ex00_bytes", "000000000000"), ["another version of the course", "'000000000000'", "pip install", "restart"]),
    (("ex99_from_the_future",), ["does not know exercise 'ex99_from_the_future'", "ex00_bytes", "pip install"]),
    (("nonsense",), ["check('nonsense')", "ex00_bytes, ex01_bf16_rounding", ".ipynb"]),
    ((), ["found no exercise notebook", 'check("ex00_bytes")', "ex11_stochastic_rounding"]),
])
def test_check_says_what_does_not_match_and_how_to_fix_it(monkeypatch, nowhere, call, says):
    """A notebook of another version of the course than the package, a name the package does not
    know, and a notebook that names no exercise where no file is found: one sentence each."""
    monkeypatch.setattr(check_module, "_shell", lambda: SimpleNamespace(user_ns={"torch": torch}))
    with pytest.raises(ValueError) as raised:
        check_module.check(*call)
    assert all(part in str(raised.value) for part in says), str(raised.value)



MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())
SLEEP_MARKER = "613.371"  # the argument of the `sleep` that ex00_detached_process and ex00_fork_army leave behind


def _digests(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).glob("*")) if p.is_file()}


def _grade_fixtures(names, submissions, solutions, gradebook, env):
    """`mpcourse grade` of the fixtures `names`, in that order: their results by fixture name."""
    result = _mpcourse("grade", *(str(submissions / f"{name}.ipynb") for name in names), "--solutions",
                       str(solutions), "--timeout", "30", "--jobs", "2", "--json", "--csv", str(gradebook),
                       env=env, timeout=30, jobs=2)
    assert result.returncode == 0, result.stderr
    return {Path(s["path"]).stem: s for s in json.loads(result.stdout)["submissions"]}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grading")
    solutions, submissions = tmp / "solutions", tmp / "submissions"  # the saboteurs attack only pytest's folders
    shutil.copytree(ROOT / "solutions", solutions)
    shutil.copytree(FIXTURES, submissions)
    before = {"solutions": _digests(solutions), "submissions": _digests(submissions)}
    env = dict(os.environ, MPCOURSE_SABOTAGE_TARGET=str(solutions / "ex00_bytes.ipynb"))
    # the saboteurs go first and the partial answer last, so a successful sabotage would show
    first = ["ex00_sabotage", "ex00_ipython_startup", "ex00_detached_process"]
    loaded = sorted(name for name in MANIFEST if MANIFEST[name]["load_sensitive"])
    names = first + sorted(set(MANIFEST) - set(first + loaded + ["ex00_partial"])) + ["ex00_partial"]
    got = _grade_fixtures(names, submissions, solutions, tmp / "grades.csv", env)
    # the load-sensitive fixtures (MANIFEST.json) then, beside two CPU hogs: the budgets are CPU time
    # of each sandbox, so every score is MANIFEST's (what an idle machine gives), only later
    hogs = cpu_hogs(2)
    try:
        got |= _grade_fixtures(loaded, submissions, solutions, tmp / "grades-under-load.csv", env)
    finally:
        stop(hogs)
    # no sleep for a detached process to act: `survivors` shows none is left that could
    return SimpleNamespace(
        submissions=got, gradebooks=[tmp / "grades.csv", tmp / "grades-under-load.csv"],
        before=before, after={"solutions": _digests(solutions), "submissions": _digests(submissions)},
        survivors=sandbox_processes(SLEEP_MARKER), solutions=solutions, tmp=tmp)


def test_every_fixture_names_the_wall_it_attacks_and_whether_load_could_move_its_score():
    """The fallback sandbox grades only the fixtures that attack one of its walls, and the CPU hogs
    run beside the load-sensitive ones only: so each fixture says both, as build_fixtures.py tags
    it, every wall has a fixture, and every fixture that runs out of time is graded under load."""
    spec = importlib.util.spec_from_file_location("build_fixtures", FIXTURES / "build_fixtures.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert {name: (entry["wall"], entry["load_sensitive"]) for name, entry in MANIFEST.items()} == \
        {name: (build.wall_of(name), name in build.LOAD_SENSITIVE) for name in build.FIXTURES}, \
        "MANIFEST.json is not what build_fixtures.py writes: run it"
    assert {entry["wall"] for entry in MANIFEST.values()} == set(build.WALLS) | {None}
    timed_out = {name for name, entry in MANIFEST.items() if "timed out" in (entry["error"] or "")}
    assert timed_out and all(MANIFEST[name]["load_sensitive"] for name in timed_out), timed_out


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_hostile_submission_scores_its_honest_work_with_a_reason(graded, name):
    expected, got = MANIFEST[name], graded.submissions[name]
    assert got["score"] == expected["score"], (expected["why"], got)
    assert got["exercise"] == expected["exercise"], got
    if expected["error"] is None:
        assert got["error"] is None, got["error"]
    else:
        assert expected["error"] in (got["error"] or ""), got["error"]
    exercise = load_exercise(ROOT / "solutions" / f"{expected['exercise']}.ipynb")
    assert got["max_score"] == exercise.max_score and len(got["tests"]) == len(exercise.tests)
    for test in got["tests"]:
        assert test["passed"] == (test["points"] == test["max_points"])
        assert test["passed"] or test["reason"], f"{name}: a failed test needs a reason"


def test_solutions_and_every_submission_are_byte_identical_after_grading(graded):
    assert graded.after == graded.before


def test_no_process_outlives_grading(graded):
    assert graded.survivors == [], "a submission's detached process survived its sandbox"


def test_a_killed_cell_is_skipped_and_noted(graded):
    notes = graded.submissions["ex00_os_exit"]["notes"]
    assert any("code cell 4 stopped the submission's process" in note for note in notes), notes
    # 40 MiB at once: the output counter (32 MiB) or the reply's line cap (16 MiB) stops it first,
    # whichever sees the bytes first on a busy machine; either way the cell is stopped and noted
    huge = graded.submissions["ex00_huge_output"]["notes"]
    assert any("printed more than 32 MiB" in note or "sent a reply line over 16 MiB" in note for note in huge), huge


def test_timeouts_name_what_ran_out_and_the_budget_it_had(graded):
    """Issue 33: a skipped cell's restart gets a fresh budget; a timeout names the cell or the
    test's call, and the budget (--timeout 30 here): one --timeout for an endless cell of ex04,
    not one per test."""
    printing = graded.submissions["ex00_endless_print_cell"]
    assert printing["score"] == 4 and any("code cell 4 stopped" in note for note in printing["notes"]), printing
    slow = {t["id"]: t["reason"] for t in graded.submissions["ex00_slow_tests"]["tests"]}
    # its 30 s of CPU time, or, on a machine over 5x oversubscribed, the wall-clock backstop first
    endless_test = slow["any_size_matches_torch"]
    assert "tensor_bytes ran past the test's" in endless_test and "30 s" in endless_test, slow
    assert slow["fp16_ten_million"] is None  # it waited 20 s: wall clock, not CPU time
    endless = graded.submissions["ex04_endless_loop"]["error"]
    assert endless.startswith("timed out: code cell ") and " 30 s " in endless, endless
    spinners = graded.submissions["ex00_setsid_spinners"]["error"]
    assert spinners.startswith("timed out: code cell 4 ran past") and "30 s" in spinners, spinners


def test_failing_tests_say_why(graded):
    submissions = graded.submissions
    assert submissions["ex00_raises"]["tests"][0]["reason"] == "ValueError: 'I gave up'"  # the submission's text, quoted
    partial = {t["id"]: t for t in submissions["ex00_partial"]["tests"]}
    assert partial["fp32_ten_million"]["passed"] and not partial["fp16_ten_million"]["passed"]
    assert "20,000,000" in partial["fp16_ten_million"]["reason"]
    fakes = {t["id"]: t["reason"] for t in submissions["ex09_fakes_checks"]["tests"]}
    # every test runs in the grader: the sandbox's patched min and torch.equal change nothing, and
    # the reason is the test's own message, about the model the grader holds
    assert fakes["loop_a_scale_healthy"] == "loop A must train exactly like the reference loop with zero_grad", fakes
    assert fakes["loop_b_clip_order"].startswith("after 30 steps your weights differ from the FP32 loop"), fakes
    crash = {t["id"]: t["reason"] for t in submissions["ex06_shape_crash"]["tests"]}
    assert all(re.match("RuntimeError: ['\"]", r) and "\n" not in r for i, r in crash.items() if not i.startswith("predict")), crash
    assert "malformed answer" in submissions["ex03_returns_qint8"]["tests"][0]["reason"]
    assert "not one that crosses" in submissions["ex03_returns_qint8"]["tests"][0]["reason"]
    wrong = {t["id"]: t["reason"] for t in submissions["ex01_correct_changes_input"]["tests"]}
    assert wrong["random_values"] == "don't modify the input tensor", wrong


def test_hidden_tests_do_not_leak_through_reasons(graded):
    ex00 = " ".join(t["reason"] or "" for t in graded.submissions["ex00_leaks_hidden_tests"]["tests"])
    assert "10_000_000_000" not in ex00 and "10 billion" not in ex00, ex00
    ex09 = " ".join(t["reason"] or "" for t in graded.submissions["ex09_leaks_hidden_tests"]["tests"])
    assert "scaled_reference_a" not in ex09 and "reference_b" not in ex09, ex09
    assert all(len(t["reason"] or "") <= 300 for t in graded.submissions["ex09_leaks_hidden_tests"]["tests"])


# fixtures that run as they are in Jupyter and do not attack the kernel check() runs in
IN_JUPYTER = ["ex00_correct", "ex00_partial", "ex00_numpy_int", "ex00_split_test_cell", "ex01_correct",
              "ex01_numpy_predictions", "ex01_correct_changes_input", "ex01_zeros", "ex02_breakdown_subclass",
              "ex02_value_error_subclass", "ex03_raises_type_error", "ex03_returns_qint8", "ex05_numpy_and_namedtuple",
              "ex06_correct", "ex06_divides_gradients", "ex06_memory_bug", "ex07_partial", "ex09_wrong_loops"]


@pytest.mark.parametrize("name", IN_JUPYTER)
def test_check_gives_the_graders_verdict_test_by_test(graded, name):
    """check(), run in a kernel (a sandboxed one: the notebook is a fixture) after the notebook's
    cells, passes and fails the tests the grader passes and fails. check() runs what the learner
    sees: a test with hidden lines that it fails, the grader fails too; one it passes, the grader
    may still fail on the hidden lines (ex09_wrong_loops' loop A)."""
    from mpcourse.grading.judging.exercise import learner_cells
    from mpcourse.grading.sandbox.limits import Limits
    from mpcourse.grading.sandbox.sandbox import Sandbox
    path = FIXTURES / f"{name}.ipynb"
    exercise = load_exercise(ROOT / "solutions" / f"{MANIFEST[name]['exercise']}.ipynb")
    deadline = submission_budget(exercise, f"check() on {name}")
    with Sandbox(Limits(), deadline) as worker:
        for cell in learner_cells(nbformat.read(path, as_version=4), exercise):
            worker.request({"op": "run_cell", "source": cell}, deadline)
        worker.request({"op": "run_cell", "source": (
            f"import pathlib\npathlib.Path('notebook.ipynb').write_text({path.read_text()!r})\n"
            "from mpcourse.grading import check\n"
            "CHECKED = [[r.id, r.passed] for r in check('notebook.ipynb').results]")}, deadline)
        checked = codec.decode(worker.request({"op": "value", "name": "CHECKED"}, deadline)["value"])
    graded_verdicts = {t["id"]: t["passed"] for t in graded.submissions[name]["tests"]}
    whole = {t.id for t in exercise.tests if t.source == t.visible}
    assert checked
    assert {i: p for i, p in checked if i in whole} == {i: graded_verdicts[i] for i, _ in checked if i in whole}
    assert all(graded_verdicts[i] is False for i, p in checked if i not in whole and not p)


@pytest.mark.parametrize("path", sorted((ROOT / "solutions").glob("ex*.ipynb")), ids=lambda p: p.stem)
def test_every_solution_checks_to_full_marks_without_its_file(path):
    """Each solution's cells run in a kernel whose working folder holds no notebook (the
    sandbox's, as Colab's), then its own check() cell: every visible test passes, from the tests
    the package ships."""
    from mpcourse.grading.sandbox.limits import Limits
    from mpcourse.grading.sandbox.sandbox import Sandbox
    exercise = load_exercise(path)
    (call,) = [c.source for c in nbformat.read(path, as_version=4).cells if is_check_cell(c)]
    deadline = submission_budget(exercise, f"check() of {path.stem} without its file")
    with Sandbox(Limits(), deadline) as worker:
        for cell in exercise.code_cells:
            worker.request({"op": "run_cell", "source": cell}, deadline)
        worker.request({"op": "run_cell", "source": (
            f"import glob\nNOTEBOOKS = glob.glob('*.ipynb')\n{call.replace('check(', 'SCORE = check(')}\n"
            "CHECKED = [[r.id, r.passed, r.reason] for r in SCORE.results]")}, deadline)
        notebooks, checked = (codec.decode(worker.request({"op": "value", "name": name}, deadline)["value"])
                              for name in ("NOTEBOOKS", "CHECKED"))
    assert notebooks == []
    assert [test_id for test_id, _, _ in checked] == [t.id for t in checkable.shipped(path.stem).tests]
    assert checked and all(passed for _, passed, _ in checked), checked


def test_metadata_naming_another_exercise_is_reported_not_trusted(graded):
    got = graded.submissions["ex00_claims_other_exercise"]
    assert got["exercise"] == "ex00_bytes"
    assert any("'ex09_diagnose'" in note and "from the file name" in note for note in got["notes"]), got["notes"]


def test_gradebook_has_a_row_per_test_escapes_formulas_and_control_characters(graded):
    text = "".join(book.read_text() for book in graded.gradebooks)
    rows = [row for book in graded.gradebooks for row in csv.DictReader(book.read_text().splitlines())]
    assert len(rows) == sum(len(s["tests"]) or 1 for s in graded.submissions.values())
    correct = [r for r in rows if Path(r["path"]).stem == "ex00_correct"]
    assert {r["test"] for r in correct} == {"fp32_ten_million", "fp16_ten_million", "bf16_matches_torch",
                                            "any_size_matches_torch"}
    assert all(r["passed"] == "True" and r["score"] == "4.0" for r in correct)
    formula = [r for r in rows if Path(r["path"]).stem == "ex00_formula_and_escapes"]
    assert formula and not any(cell.startswith(("=", "+", "@")) for r in rows for cell in r.values()), formula[0]
    assert "\x1b" not in text and "\\x1b[2J" in formula[0]["error"], formula[0]  # shown as an escape, not acted on
    assert not list(graded.tmp.glob(".grades*.csv.*")), "a temporary gradebook was left behind"


def test_an_untouched_exercise_still_scores_zero_in_a_later_run(graded):
    result = _mpcourse("grade", str(ROOT / "exercises" / "ex00_bytes.ipynb"), "--solutions", str(graded.solutions),
                       "--json", "--timeout", "60", timeout=60)
    assert result.returncode == 0, result.stderr
    (got,) = json.loads(result.stdout)["submissions"]
    assert got["score"] == 0 and got["max_score"] == 4, got


def test_without_bubblewrap_the_grader_falls_back_as_root_or_refuses_and_says_how_to_get_one(tmp_path):
    """As root, the fallback sandbox (a uid per submission) grades, and says so and why; as any
    other user nothing can confine a submission, so the grader refuses and says how to get bwrap."""
    result = _mpcourse("grade", str(FIXTURES / "ex00_correct.ipynb"), env=dict(os.environ, PATH=str(tmp_path)))
    assert "bubblewrap (`bwrap`) is not installed" in result.stderr
    if os.geteuid() == 0:
        assert result.returncode == 0, result.stderr
        assert "sandbox: an unprivileged user per submission" in result.stderr and "does not isolate" in result.stderr
        assert "4/4" in result.stdout and "graded in the fallback sandbox" in result.stdout
    else:
        assert result.returncode == 2
        assert "apt-get install bubblewrap" in result.stderr and "--unsafe-no-sandbox" in result.stderr


def test_unsafe_no_sandbox_grades_with_a_warning_in_the_output_and_the_gradebook(tmp_path):
    result = _mpcourse("grade", str(FIXTURES / "ex00_partial.ipynb"), "--unsafe-no-sandbox", "--csv",
                       str(tmp_path / "grades.csv"), env=dict(os.environ, PATH=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert "WARNING" in result.stderr and "WITHOUT a sandbox" in result.stdout
    rows = list(csv.DictReader((tmp_path / "grades.csv").open()))
    assert rows[0]["score"] == "1.0" and all("WITHOUT a sandbox" in r["notes"] for r in rows)


def test_a_link_or_an_oversized_file_is_not_read(tmp_path):
    from mpcourse.grading.grader import MAX_NOTEBOOK_BYTES, grade_submission
    exercises = {"ex00": load_exercise(ROOT / "solutions" / "ex00_bytes.ipynb")}
    link = tmp_path / "ex00_bytes.ipynb"
    link.symlink_to(ROOT / "solutions" / "ex00_bytes.ipynb")  # would score the instructor's answer
    big = tmp_path / "big" / "ex00_bytes.ipynb"
    big.parent.mkdir()
    big.write_bytes(b" " * (MAX_NOTEBOOK_BYTES + 1))
    for path, reason in ((link, "not a regular file"), (big, "larger than the 50 MiB")):
        result = grade_submission(path, exercises, {})
        assert result.score == 0 and reason in result.error, result.error
        assert len(result.tests) == 4 and all(t.reason == result.error for t in result.tests)


def test_grade_rejects_a_missing_solutions_folder(tmp_path):
    result = _mpcourse("grade", str(FIXTURES / "ex00_correct.ipynb"), "--solutions", str(tmp_path))
    assert result.returncode == 2 and "no solution notebooks" in result.stderr


# ---- the pieces, without a sandbox ----

@pytest.mark.parametrize("value", [
    7, -3.5, float("inf"), "text", None, True, [1, (2, 3)], {"a": torch.bfloat16, 4: [None]},
    (2**80, -0.0),
])
def test_plain_data_round_trips(value):
    assert codec.decode(json.loads(json.dumps(codec.encode(value)))) == value


@pytest.mark.parametrize("tensor", [
    torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([1.5, -0.0, float("nan")], dtype=torch.bfloat16),
    torch.tensor([448.0, -2.0]).to(torch.float8_e4m3fn), torch.tensor([True, False]), torch.zeros(0, 3),
    torch.arange(10, dtype=torch.int64)[::3],
])
def test_tensors_round_trip_bit_for_bit(tensor):
    back = codec.decode(json.loads(json.dumps(codec.encode(tensor))))
    assert type(back) is torch.Tensor and back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back.view(torch.uint8) if back.dtype != torch.bool else back,
                       tensor.contiguous().view(torch.uint8) if tensor.dtype != torch.bool else tensor)


def test_only_the_plain_value_of_a_number_subclass_crosses():
    class Anything(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__
    assert type(codec.decode(codec.encode(Anything(3)))) is int
    with pytest.raises(codec.NotPlainData, match="Linear"):
        codec.encode(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("data, problem", [
    ({"$": "pickle", "data": "gASV"}, "unknown tag"),
    ({"no": "tag"}, "unexpected dict"),
    ({"$": "tensor", "dtype": "float32", "shape": [2], "data": "AAAA"}, "not the base64 of 2"),
    ({"$": "tensor", "dtype": "os.system", "shape": [], "data": ""}, "not one that crosses"),
    ({"$": "tensor", "dtype": "float32", "shape": [1 << 40], "data": ""}, "too large"),
    ({"$": "dataclass", "classes": [["os", "system"]], "fields": {}}, "not a dataclass the grader knows"),
    ({"$": "dataclass", "classes": [["mpcourse.memory.accounting", "MemoryBreakdown"]], "fields": {"x": 1}}, "fields"),
    ({"$": "dict", "items": [[[1], 2]]}, "unhashable"),
])
def test_decoding_rejects_what_is_not_a_valid_encoding(data, problem):
    import mpcourse.memory.accounting  # noqa: F401  the grader has loaded the modules its exercises import
    with pytest.raises(codec.MalformedData, match=problem):
        codec.decode(data)


def test_dataclasses_of_modules_the_grader_loaded_are_rebuilt():
    from mpcourse.memory.accounting import MemoryBreakdown
    breakdown = MemoryBreakdown(parameters=1, master_parameters=2, activations=3, gradients=4, optimizer_state=5)
    back = codec.decode(json.loads(json.dumps(codec.encode(breakdown))))
    assert type(back) is MemoryBreakdown and back == breakdown


def test_a_reported_exception_is_rebuilt_from_builtins_only():
    assert type(codec.decode_error({"$": "raised", "type": "ValueError", "message": "m"})) is ValueError
    for name in ("SystemExit", "KeyboardInterrupt", "StopIteration", "Evil", "Exception"):
        error = codec.decode_error({"$": "raised", "type": name, "message": "m"})
        assert type(error) is codec.UnknownError and str(error) == f"{name}: m"


@pytest.mark.parametrize("cell, shown", [
    ("=1+1", "'=1+1"), ("+SUM(A1)", "'+SUM(A1)"), ("@cmd", "'@cmd"), ("-2", "-2"), ("-x", "'-x"),
    ("fine\x1b[31m red\x07", "fine\\x1b[31m red\\x07"), ("two\nlines", "two lines"),
])
def test_gradebook_cells_are_safe_in_a_spreadsheet_and_a_terminal(cell, shown):
    assert gradebook.spreadsheet_cell(cell) == shown


def test_the_gradebook_is_replaced_atomically(tmp_path):
    target = tmp_path / "grades.csv"
    target.write_text("old")
    result = gradebook.SubmissionResult("a.ipynb", "ex00_bytes", 1.0, 4.0, None)
    gradebook.write_gradebook([result], target)
    assert target.read_text().startswith("path,exercise") and list(tmp_path.iterdir()) == [target]


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsafe-no-sandbox"])
def test_a_worker_computes_with_the_graders_kernel_settings(monkeypatch, sandboxed):
    """Behavioural tests compare the learner's run with the solution's reference run to float
    tolerance: the worker must pick the kernels and threads the grader's own processes pick."""
    from mpcourse.grading.sandbox.limits import Limits
    from mpcourse.grading.sandbox.sandbox import Sandbox
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPCOURSE_NOT_FOR_THE_WORKER", "secret")
    deadline = Budget(60)
    with Sandbox(Limits(), deadline, sandboxed=sandboxed) as worker:
        worker.request({"op": "run_cell", "source": (
            "import os, torch\n"
            "seen = [os.environ.get('ATEN_CPU_CAPABILITY'), torch.backends.cpu.get_cpu_capability(),\n"
            "        torch.get_num_threads(), os.environ.get('MPCOURSE_NOT_FOR_THE_WORKER')]")}, deadline)
        seen = codec.decode(worker.request({"op": "value", "name": "seen"}, deadline)["value"])
    assert seen == ["default", "DEFAULT", 1, None]
