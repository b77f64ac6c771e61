"""Verdicts nobody inside the sandbox can forge, hidden tests that stay hidden, honest work scored
right (issue 28, part B).

A model test runs in the learner's process, rewritten by `checks.split_tests`: the sandbox logs the
values each check is made of and the grader decides. These tests hold the split to the solutions'
own tests, the decision to each test's own tolerance, and the fixtures' attacks to their honest
twins' scores (tests/test_grading.py grades every fixture against MANIFEST.json).
"""
import ast
import collections
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mpcourse.grading import codec, judge
from mpcourse.grading.checks import Check, Opaque, split_tests
from mpcourse.grading.exercise import BEGIN_HIDDEN, END_HIDDEN, find_solutions, load_exercise
from mpcourse.grading.verdict import run_test

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())
EXERCISES = {key: load_exercise(path) for key, path in find_solutions(ROOT / "solutions").items()}

# attack -> its honest twin: the same work without the attack
TWINS = {
    "ex06_memory_bug_forges_verdicts": "ex06_memory_bug",
    "ex03_raises_own_error": "ex03_raises_type_error",
    "ex01_zeros_changes_input": "ex01_zeros",
    "ex07_partial_changes_input": "ex07_partial",
    "ex00_course_answer_imported": "ex00_stub",
    "ex05_course_answer_hidden": "ex05_stub",
    "ex04_smuggles_hidden_code": "ex04_stub",
    "ex09_forges_check_log": "ex09_wrong_loops",
}
# honest variants of right answers: full marks
HONEST = ["ex00_numpy_int", "ex05_numpy_and_namedtuple", "ex02_value_error_subclass", "ex04_helper_cells",
          "ex00_quotes_check_line", "ex00_magics", "ex00_schema_invalid", "ex06_float64_loss"]


def _messages(source):
    """The string constants of every assert message and AssertionError of a test."""
    found = []
    for node in ast.walk(ast.parse(source)):
        message = node.msg if isinstance(node, ast.Assert) else None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            message = node.exc.args[0]
        if message is not None:
            found += [c.value for c in ast.walk(message) if isinstance(c, ast.Constant)
                      and isinstance(c.value, str) and len(c.value) >= 12]
    return found


def _without_messages(source):
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            node.msg = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            node.exc.args = []
    return ast.unparse(tree)


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_what_the_sandbox_receives_has_no_assert_message_or_condition(key):
    tests = EXERCISES[key].tests
    splits, checks = split_tests([t.source for t in tests])
    for test, split in zip(tests, splits):
        tree = ast.parse(split.source)  # it compiles
        assert not any(isinstance(n, ast.Assert) for n in ast.walk(tree)), test.id
        elsewhere = _without_messages(test.source)
        for message in _messages(test.source):
            assert message not in split.source or message in elsewhere, (test.id, message)
    assert sum(len(s.checks) for s in splits) == len(checks)


def test_a_condition_and_its_constants_stay_in_the_grader():
    (split,), (check,) = split_tests(['got = f(3)\nassert abs(got - 4.25) < 1e-3, f"expected 4.25, got {got}"'])
    assert "4.25" not in split.source and "0.001" not in split.source and "expected" not in split.source
    assert check.names == ["got"] and check.holds([4.2504]) and not check.holds([4.26])


def _check(condition):
    (_,), (check,) = split_tests([f"assert {condition}, 'the check failed'"])
    return check


def test_forged_equal_values_fail_beside_the_solutions():
    check = _check("torch.equal(mine, right)")
    solution = [torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])]
    assert check.passes(solution, solution)
    forged = [torch.zeros(2), torch.zeros(2)]  # the sandbox says both sides were zeros
    assert check.holds(forged) and not check.passes(forged, solution)


def test_forged_rows_of_a_comprehension_fail_column_by_column():
    check = _check("all(torch.equal(p, q) for p, q in zip(yours, reference))")
    assert check.rows == [True]
    solution = [[[torch.ones(2), torch.ones(2)], [torch.zeros(1), torch.zeros(1)]]]
    forged = [[[torch.full((2,), 7.0), torch.full((2,), 7.0)], [torch.ones(1), torch.ones(1)]]]
    assert check.passes(solution, solution)
    assert check.holds(forged) and not check.passes(forged, solution)


def test_exact_checks_are_exact_and_toleranced_ones_keep_their_tolerance():
    exact = _check("torch.equal(a, b)")
    one = torch.tensor([1.0])
    next_up = torch.nextafter(one, torch.tensor([2.0]))
    assert exact.passes([one, one], [one, one]) and not exact.passes([next_up, one], [one, one])
    (_,), (close,) = split_tests(["torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)"])
    assert close.call
    reference = torch.tensor([1000.0])
    assert close.passes([reference * (1 + 5e-6), reference], [reference, reference])
    assert not close.passes([reference * (1 + 5e-5), reference], [reference, reference])
    isclose = _check("math.isclose(a, b, rel_tol=1e-9)")
    assert isclose.holds([1.0, 1.0 + 1e-12]) and not isclose.holds([1.0, 1.0 + 1e-6])


def test_a_value_that_failed_or_is_not_data_fails_the_check():
    check = _check("x == 3")
    assert not check.holds([Opaque("GPT")])
    assert check.passes([3], [Opaque("GPT")])  # a solution's value that is not data is not swapped in
    assert not judge.beside_verdict(_plan("assert x == 3, 'three'"), "t",
                                    {"checks": [{"k": 0, "leaves": [{"$": "leaf-error", "type": "KeyError"}],
                                                 "names": {}}], "raised": None})[0]


def _plan(source, reference=None):
    splits, checks = split_tests([source])
    return judge.Plan({"t": False}, {"t": splits[0]}, checks, {"t": reference}, {})


def test_the_reason_is_the_tests_own_message_with_the_submissions_text_quoted_and_cut():
    plan = _plan('assert got == "ok", f"expected ok, got {got}"')
    long = "x" * 10_000
    passed, reason = judge.beside_verdict(plan, "t", {"checks": [
        {"k": 0, "leaves": [long], "names": {"got": long}}], "raised": None})
    assert not passed and reason.startswith("expected ok, got 'xxx") and len(reason) < 120


def test_no_pass_flag_is_read_and_a_missing_check_fails():
    source = "assert x == 1, 'one'\nassert y == 2, 'two'"
    reference = {"checks": [{"k": 0, "leaves": [1], "names": {}}, {"k": 1, "leaves": [2], "names": {}}],
                 "raised": None}
    plan = _plan(source, reference)
    assert judge.beside_verdict(plan, "t", reference) == (True, None)
    dropped = {"checks": reference["checks"][:1], "raised": None, "passed": True, "reason": None}
    assert judge.beside_verdict(plan, "t", dropped) == (False, "the test stopped before all of its checks ran")
    raised = dict(reference, raised={"$": "raised", "type": "ZeroDivisionError", "message": "secret source"})
    passed, reason = judge.beside_verdict(plan, "t", raised)
    assert not passed and "ZeroDivisionError" in reason and "secret" not in reason


def test_a_helper_an_earlier_test_defined_logs_checks_the_grader_can_find():
    splits, checks = split_tests(["def helper(v):\n    assert v > 0, 'positive'", "helper(3)"])
    assert len(checks) == 1 and "__mpcourse_check__(0," in splits[0].source


def test_an_exception_decodes_to_its_nearest_builtin_type_never_runtime_error():
    class NameNotKnown(ValueError):
        pass
    error = codec.decode_error(json.loads(json.dumps(codec.encode_error(NameNotKnown("bad")))))
    assert type(error) is ValueError and str(error) == "bad"

    class PromotionError(Exception):
        pass
    unknown = codec.decode_error(codec.encode_error(PromotionError("cat")))
    assert not isinstance(unknown, RuntimeError) and isinstance(unknown, codec.UnknownError)


def test_numpy_values_namedtuples_and_sets_are_plain_data():
    Update = collections.namedtuple("Update", "scale tracker")
    value = Update(np.float32(0.1), np.int64(3))
    back = codec.decode(json.loads(json.dumps(codec.encode(value))))
    assert back == (float(np.float32(0.1)), 3) and type(back[0]) is float and type(back[1]) is int
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert torch.equal(codec.decode(codec.encode(array)), torch.from_numpy(array))
    assert codec.decode(codec.encode({1.0, 2.5})) == {1.0, 2.5}


def test_a_hidden_tests_line_is_not_shown_when_its_assert_has_no_message():
    source = "x = 1\nassert x == 2"
    assert run_test(source, {}, "t", show_source=False) == (False, "an assertion of this test failed")
    assert run_test(source, {}, "t") == (False, "assertion failed: assert x == 2")
    leak = codec.decode_error({"$": "raised", "type": "AssertionError", "message": "y" * 500})
    passed, reason = run_test("raise error", {"error": leak}, "t", show_source=False)
    assert reason.startswith("AssertionError raised by your code: 'yyy") and len(reason) < 130


def test_the_course_answers_are_stubs_by_object_not_by_name():
    program = """
import importlib, torch
import mpcourse.memory as memory
from mpcourse.memory import tensor_bytes as alias
from mpcourse.grading.stubs import write_yourself
from mpcourse.fp8 import DelayedScaling
from mpcourse.formats import FP8_E4M3
assert alias(4, torch.float32) == 16
write_yourself(["mpcourse.memory:tensor_bytes", "mpcourse.fp8:DelayedScaling"])
calls = [lambda: alias(4, torch.float32), lambda: getattr(memory, "tensor_bytes")(4, torch.float32),
         lambda: importlib.import_module("mpcourse.memory").__dict__["tensor_bytes"](4, torch.float32),
         lambda: DelayedScaling(FP8_E4M3)]
for call in calls:
    try:
        call()
    except NotImplementedError as error:
        assert "this exercise asks you to write" in str(error), error
    else:
        raise SystemExit("a stubbed answer still ran")
print("stubbed")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "stubbed", done.stderr[-2000:]


def test_every_exercise_names_targets_that_exist():
    from mpcourse.grading.stubs import _functions, _resolve
    named = {key: ex.write_yourself for key, ex in EXERCISES.items()}
    assert named["ex00"] and named["ex01"] and named["ex05"] and named["ex08"]
    for targets in named.values():
        for target in targets:
            assert _functions(_resolve(target)), target


@pytest.mark.parametrize("attack, twin", sorted(TWINS.items()))
def test_each_attack_is_expected_to_score_what_its_twin_scores(attack, twin):
    """tests/test_grading.py grades every fixture against MANIFEST.json: so each attack scores its twin's."""
    assert MANIFEST[attack]["exercise"] == MANIFEST[twin]["exercise"]
    assert MANIFEST[attack]["score"] == MANIFEST[twin]["score"]


@pytest.mark.parametrize("name", HONEST)
def test_honest_variants_are_expected_to_score_full_marks(name):
    exercise = EXERCISES[name[:4]]
    assert MANIFEST[name]["score"] == exercise.max_score


def _hidden_lines():
    """Every line of every solution's hidden tests long enough to mean something."""
    lines = set()
    for exercise in EXERCISES.values():
        path = ROOT / "solutions" / f"{exercise.name}.ipynb"
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            inside = False
            for line in source.splitlines():
                if line.strip() == BEGIN_HIDDEN:
                    inside = True
                elif line.strip() == END_HIDDEN:
                    inside = False
                elif inside and len(line.strip()) >= 24:
                    lines.add(line.strip())
    return lines


def test_no_hidden_test_line_reaches_a_gradebook_and_a_cast_is_evidence_not_a_verdict(tmp_path):
    names = ["ex00_leaks_hidden_tests", "ex09_leaks_hidden_tests", "ex04_smuggles_hidden_code", "ex09_fakes_checks",
             "ex01_cast_behind_helper", "ex01_zeros"]
    for name in names:
        (tmp_path / f"{name}.ipynb").write_bytes((FIXTURES / f"{name}.ipynb").read_bytes())
    done = subprocess.run([sys.executable, "-m", "mpcourse.cli", "grade", *sorted(map(str, tmp_path.glob("*.ipynb"))),
                           "--jobs", "2", "--json", "--csv", str(tmp_path / "grades.csv")],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    shown = json.dumps(report) + (tmp_path / "grades.csv").read_text()
    leaked = [line for line in _hidden_lines() if line in shown or json.dumps(line)[1:-1] in shown]
    assert not leaked, leaked[:3]
    scores = {Path(s["path"]).stem: s["score"] for s in report["submissions"]}
    assert scores == {name: MANIFEST[name]["score"] for name in names}
    notes = {Path(s["path"]).stem: " ".join(s["notes"]) for s in report["submissions"]}
    assert "evidence, not a verdict" in notes["ex01_cast_behind_helper"] and "bfloat16" in notes["ex01_cast_behind_helper"]
    assert "evidence" not in notes["ex01_zeros"]
    with open(tmp_path / "grades.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert {Path(row[0]).stem for row in rows[1:]} >= set(names)
