"""Verdicts nobody inside the sandbox can forge, hidden tests that stay hidden, honest work scored
right (issues 28 and 33).

Every test runs in the grader; the learner's process only serves calls to the learner's functions,
with data in and data out (`judge`, `codec`). These tests hold that no test code reaches that
process, that data has a schema, and the fixtures' attacks to their honest twins' scores
(tests/test_grading.py grades every fixture against MANIFEST.json).
"""
import collections
import copy
import csv
import dataclasses
import functools
import json
import subprocess
import sys
from pathlib import Path

import nbformat

import numpy as np
import pytest
import torch

from cached_plans import MPCOURSE
from grading_budgets import backstop, program_backstop, submission_budget

from mpcourse.grading import grader, watch
from mpcourse.grading.judging import codec, judge
from mpcourse.grading.judging.exercise import (BEGIN_HIDDEN, END_HIDDEN, check_line, find_solutions, is_check_cell,
                                                learner_cells, load_exercise)
from mpcourse.grading.judging.verdict import Quoted, quoted, run_test

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())
SOLUTIONS = find_solutions(ROOT / "solutions")


@functools.cache
def exercises() -> dict:
    """Every exercise as the grader loads it from its solution (when a test first asks)."""
    return {key: load_exercise(path) for key, path in SOLUTIONS.items()}

# attack -> its honest twin: the same work without the attack
TWINS = {
    "ex06_memory_bug_forges_verdicts": "ex06_memory_bug",
    "ex09_copies_test_reference": "ex09_wrong_loops",
    "ex03_returns_qint8": "ex03_returns_int8",
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
          "ex00_quotes_check_line", "ex00_answer_beside_check_call", "ex00_magics", "ex00_schema_invalid", "ex06_float64_loss", "ex01_correct",
          "ex02_breakdown_subclass", "ex00_split_test_cell", "ex06_correct", "ex06_divides_gradients"]


RECORDER = """import gc, sys
SEEN = []
def _record(event, args):
    # every source compiled from a string and every code object executed, whatever its origin
    if event == "compile" and isinstance(args[0], (str, bytes)) and str(args[1]).startswith("<"):
        SEEN.append(args[0] if isinstance(args[0], str) else args[0].decode("utf-8", "replace"))
    elif event == "exec" and hasattr(args[0], "co_consts"):
        code = [args[0]]
        while code:
            c = code.pop()
            SEEN.append(c.co_filename + " " + " ".join(map(str, c.co_names)))
            SEEN.extend(str(k) for k in c.co_consts if isinstance(k, str))
            code.extend(k for k in c.co_consts if hasattr(k, "co_consts"))
sys.addaudithook(_record)
"""


def _lines(source):
    return [line.strip() for line in source.splitlines() if len(line.strip()) >= 20 and not line.strip().startswith("#")]


@pytest.mark.parametrize("key", sorted(SOLUTIONS))
def test_no_test_statement_or_reference_reaches_the_learners_process(key):
    """The learner's process records every source compiled from a string and every code object it
    executes; the grader records every message it sends there. Graded with the solution's own
    code, every test passes, and no line of any test, visible or hidden, is in either."""
    from mpcourse.grading.sandbox.limits import Limits
    from mpcourse.grading.sandbox.sandbox import Sandbox
    exercise = exercises()[key]
    deadline = submission_budget(exercise, f"the solution of {key}")
    sent = []
    with Sandbox(Limits(), deadline) as worker:
        def call(message):
            sent.append(json.dumps(message))
            return worker.request(message, deadline)
        call({"op": "stub", "targets": list(exercise.write_yourself)})
        for cell in (RECORDER, *exercise.code_cells):
            assert call({"op": "run_cell", "source": cell})["error"] is None
        namespace, _ = judge.grader_namespace(exercise, call)
        verdicts = judge.run_tests(exercise.tests, namespace)
        seen = "\n".join(codec.decode(worker.request({"op": "value", "name": "SEEN"}, deadline)["value"]))
    assert all(passed for passed, _ in verdicts), verdicts
    assert len(sent) > len(exercise.tests)
    # a test's lines that are also the notebook's own or the library's do not tell where they came from
    known = set(_lines("\n".join(exercise.code_cells))) | {
        line for path in (ROOT / "mpcourse").rglob("*.py") for line in _lines(path.read_text())}
    sent = "\n".join(sent)
    for test in exercise.tests:
        for line in set(_lines(test.source)) - known:
            assert line not in seen and json.dumps(line)[1:-1] not in sent, (test.id, line)


@pytest.mark.parametrize("name", codec.DTYPE_NAMES)
def test_every_accepted_dtype_round_trips_as_a_tensor_and_as_a_value(name):
    dtype = getattr(torch, name)
    tensor = torch.zeros(3, dtype=dtype)
    back = codec.decode(json.loads(json.dumps(codec.encode([tensor, dtype]))))
    assert back[0].dtype == dtype and back[0].shape == (3,) and back[1] == dtype


@pytest.mark.parametrize("dtype", sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)
                                          and str(d).removeprefix("torch.") not in codec.DTYPES}, key=str))
def test_every_other_dtype_is_malformed_with_a_reason_never_a_crash(dtype):
    name = str(dtype).removeprefix("torch.")
    for data in ({"$": "dtype", "name": name}, {"$": "tensor", "dtype": name, "shape": [1], "data": "AA=="}):
        with pytest.raises(codec.MalformedData, match="not one that crosses"):
            codec.decode(data)


def test_malformed_data_is_a_reason_whatever_it_holds():
    for data in ({"$": "numpy", "dtype": "int64", "value": "x"}, {"$": "numpy", "dtype": "object", "value": 1},
                 {"$": "dataclass", "classes": "x", "fields": {}}, {"$": "tuple", "items": {}}, [[[[[]]]]] * 3 + [{}]):
        with pytest.raises(codec.MalformedData):
            codec.decode(data)


def test_numpy_values_keep_their_type_namedtuples_and_sets_are_plain_data():
    Update = collections.namedtuple("Update", "scale tracker")
    value = Update(np.float32(0.1), np.int64(3))
    back = codec.decode(json.loads(json.dumps(codec.encode(value))))
    assert back == (np.float32(0.1), 3) and type(back[0]) is np.float32 and type(back[1]) is np.int64
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = codec.decode(codec.encode(array))
    assert type(got) is np.ndarray and np.array_equal(got, array)
    assert codec.decode(codec.encode({1.0, 2.5})) == {1.0, 2.5}


def test_a_subclass_of_an_expected_dataclass_arrives_as_that_dataclass():
    from mpcourse.memory.accounting import MemoryBreakdown

    @dataclasses.dataclass(frozen=True)
    class Mine(MemoryBreakdown):
        note: str = "mine"
    got = codec.decode(json.loads(json.dumps(codec.encode(Mine(1, 2, 3, 4, 5)))))
    assert type(got) is MemoryBreakdown and got == MemoryBreakdown(1, 2, 3, 4, 5)


def _served(namespace):
    return judge.local_call(namespace)


def test_models_optimizers_and_scalers_cross_as_data_and_their_changes_come_back():
    def step(model, optimizer, scaler, x):
        scaler.scale(model(x).float().pow(2).mean()).backward()
        scaler.step(optimizer)
        scaler.update()
        x.add_(1)  # an input changed in place: the test sees it
        return model

    proxy = judge.AnswerProxy("step", _served({"step": step}))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    twin = copy.deepcopy(model)
    adam, twin_adam = torch.optim.Adam(model.parameters(), lr=0.1), torch.optim.Adam(twin.parameters(), lr=0.1)
    scaler, twin_scaler = torch.amp.GradScaler("cpu", growth_interval=1), torch.amp.GradScaler("cpu", growth_interval=1)
    x = torch.randn(5, 3)
    twin_x = x.clone()
    returned = proxy(model, adam, scaler, x)
    step(twin, twin_adam, twin_scaler, twin_x)
    assert returned is model and torch.equal(x, twin_x)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)
    assert scaler.get_scale() == twin_scaler.get_scale() == 2.0**17
    assert torch.equal(adam.state_dict()["state"][0]["exp_avg"], twin_adam.state_dict()["state"][0]["exp_avg"])


def test_a_tests_own_hooks_stay_here_and_probes_report_by_name():
    def run(model, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().sum().backward()

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    seen = watch(model, output_dtypes="1", autocast_in_grad="0.weight", grad_before_forward="0.weight")
    judge.AnswerProxy("run", _served({"run": run}))(model, torch.randn(2, 3))
    assert seen == {"output_dtypes": [torch.bfloat16], "autocast_in_grad": [False], "grad_before_forward": [False]}
    with pytest.raises(ValueError, match="unknown probes"):
        watch(model, anything="0")


def test_a_malformed_reply_fails_the_test_whatever_it_catches():
    proxy = judge.AnswerProxy("f", lambda message: {"value": 1, "passed": True})
    source = "try:\n    f()\nexcept Exception:\n    pass"
    passed, reason = run_test(source, {"f": proxy}, "t", show_source=False)
    assert not passed and "malformed answer" in reason
    forged = judge.AnswerProxy("f", lambda message: {"value": {"$": "tensor", "dtype": "qint8", "shape": [],
                                                                "data": ""}, "after": []})
    passed, reason = run_test("f()", {"f": forged}, "t", show_source=False)
    assert not passed and "qint8" in reason and "not one that crosses" in reason


@pytest.mark.parametrize("form", ["str", "percent", "fstring", "format", "concatenation"])
def test_quoted_text_is_cut_under_every_way_of_formatting_it(form):
    value = Quoted("leak " * 100)
    shown = {"str": lambda: "got " + str(value), "percent": lambda: "got %s" % value,
             "fstring": lambda: f"got {value}", "format": lambda: "got {}".format(value),
             "concatenation": lambda: "got " + value}[form]()
    assert shown.startswith("got 'leak leak") and shown.endswith("'…") and len(shown) < 80, shown


def test_every_string_is_quoted_however_deeply_nested():
    value = quoted({"k": [("secret " * 50, ["hidden " * 50])]})
    assert len(f"{value}") < 300 and "secret secret" in f"{value}" and "…" in f"{value}"


def test_a_cell_keeping_a_tests_metadata_but_holding_other_code_is_the_learners():
    exercise = exercises()["ex00"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(t.visible) for t in exercise.tests[:2]])
    for cell, test in zip(nb.cells, exercise.tests):
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": test.id, "points": test.points}
    nb.cells[1].source = "def helper():\n    return 2"
    nb.cells.append(nbformat.v4.new_code_cell("from mpcourse.grading import check; check()"))
    assert learner_cells(nb, exercise) == ["def helper():\n    return 2"]


@pytest.mark.parametrize("source, dropped", [
    ("from mpcourse.grading import check; check()", True),  # released before check() named its exercise
    ('from mpcourse.grading import check; check("ex00_bytes")', True),
    ('from mpcourse.grading import check; check("ex00_bytes", release="0123456789ab")', True),
    ('from mpcourse.grading import check; check("ex00_bytes"); tensor_bytes = len', False),
    ('from mpcourse.grading import check; check("ex00_bytes" + str(exec("tensor_bytes = len")))', False),
    ('from mpcourse.grading import check; check("ex00_bytes", release=exec("tensor_bytes = len"))', False),
    ('from mpcourse.grading import check; check("ex00_bytes")\ntensor_bytes = len', False),
    ('tensor_bytes = len  # from mpcourse.grading import check; check("ex00_bytes")', False),
])
def test_only_the_check_cell_itself_is_dropped_so_no_code_hides_in_one(source, dropped):
    """The grader drops a cell that is only the check() call, with literal arguments; a cell that
    adds code of any kind beside it, or computes an argument, is the learner's and runs."""
    exercise = exercises()["ex00"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    assert learner_cells(nb, exercise) == ([] if dropped else [source])


def test_the_check_cell_release_writes_is_the_one_the_grader_drops():
    line = check_line("ex01_bf16_rounding", "0123456789ab")
    assert line == 'from mpcourse.grading import check; check("ex01_bf16_rounding", release="0123456789ab")'
    assert is_check_cell(nbformat.v4.new_code_cell(line)) and is_check_cell(
        nbformat.v4.new_code_cell(check_line("ex01_bf16_rounding")))
    with pytest.raises(ValueError, match="'Ex01 rounding'"):
        check_line("Ex01 rounding")


def test_an_exception_decodes_to_its_nearest_builtin_type_never_runtime_error():
    class NameNotKnown(ValueError):
        pass
    error = codec.decode_error(json.loads(json.dumps(codec.encode_error(NameNotKnown("bad")))))
    assert type(error) is ValueError and str(error) == "bad"

    class PromotionError(Exception):
        pass
    unknown = codec.decode_error(codec.encode_error(PromotionError("cat")))
    assert not isinstance(unknown, RuntimeError) and isinstance(unknown, codec.UnknownError)


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
import mpcourse.memory.accounting as memory
from mpcourse.memory.accounting import tensor_bytes as alias
from mpcourse.grading.judging.stubs import write_yourself
from mpcourse.lowbit.fp8 import DelayedScaling
from mpcourse.numbers.formats import FP8_E4M3
assert alias(4, torch.float32) == 16
write_yourself(["mpcourse.memory.accounting:tensor_bytes", "mpcourse.lowbit.fp8:DelayedScaling"])
calls = [lambda: alias(4, torch.float32), lambda: getattr(memory, "tensor_bytes")(4, torch.float32),
         lambda: importlib.import_module("mpcourse.memory.accounting").__dict__["tensor_bytes"](4, torch.float32),
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
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=program_backstop(), cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "stubbed", done.stderr[-2000:]


def test_every_exercise_names_targets_that_exist():
    from mpcourse.grading.judging.stubs import _functions, _resolve
    named = {key: ex.write_yourself for key, ex in exercises().items()}
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
    exercise = exercises()[name[:4]]
    assert MANIFEST[name]["score"] == exercise.max_score


def _hidden_lines():
    """Every line of every solution's hidden tests long enough to mean something."""
    lines = set()
    for exercise in exercises().values():
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
    done = subprocess.run([*MPCOURSE, "grade", *sorted(map(str, tmp_path.glob("*.ipynb"))),
                           "--jobs", "2", "--json", "--csv", str(tmp_path / "grades.csv")],
                          capture_output=True, text=True, cwd=ROOT,
                          timeout=backstop(names, grader.Options().timeout, jobs=2))
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
