"""Verdicts computed outside the learner's interpreter.

A solution's test cells are plain `assert` code. The grader runs each in one of two ways,
chosen once per exercise by running the instructor's solution (`calibrate`, in a fresh process
no submission touches):

- **in the grader** (a "plain" test): every answer it calls only takes and returns plain data
  (`codec`). The test's code runs here, in the grader's process; each answer name is an
  `AnswerProxy` that sends the arguments to the submission's sandbox, where the learner's
  function runs, and decodes the reply. The asserts then run on genuine values. The test's code,
  hidden lines included, never enters the sandbox.
- **beside the answers** (a test that hands the learner's code a model, an optimizer or a
  closure): the test runs in a fresh sandboxed process that has loaded only the setup and the
  learner's answer cells, and it logs, per call of an answer, the result and the arguments'
  state afterwards (parameters, gradients, optimizer and scaler state). The test passes only if
  its asserts passed there *and* the log matches the solution's log within a float tolerance
  (`compare_calls`); the grader computes that comparison, so faking the asserts gains nothing.
"""
from __future__ import annotations

import ast
import contextlib
import io
import math
import types
from dataclasses import dataclass, field

import torch

from mpcourse.grading import codec
from mpcourse.grading.sandbox import Limits, RequestFailed, Sandbox
from mpcourse.grading.verdict import first_line, run_test

RTOL, ATOL = 1e-5, 1e-6  # the loosest tolerance any solution test allows (ex09's loop C)


@dataclass
class Plan:
    """How each test of one exercise is run, from running the solution once."""
    plain: dict[str, bool]                # test id -> runs in the grader
    calls: dict[str, list]                # test id -> the solution's log of calls, for the others
    kinds: dict[str, str]                 # answer name -> "callable" or "value"
    problems: list[str] = field(default_factory=list)  # solution tests that failed


def calibrate(exercise, deadline: float, limits: Limits, sandboxed: bool = True) -> Plan:
    """Run the instructor's solution in a fresh process, sandboxed like a submission (a solutions
    folder is data too), and plan each test."""
    with Sandbox(limits, deadline, sandboxed=sandboxed, trusted=not sandboxed) as worker:
        reply = worker.request({"op": "record", "setup": list(exercise.setup), "answer_cells": list(exercise.answer_cells),
                                "answers": list(exercise.answer_names),
                                "tests": [[t.id, t.source] for t in exercise.tests]}, deadline)
        kinds = worker.request({"op": "describe", "names": list(exercise.answer_names)}, deadline)["kinds"]
    plan = Plan({}, {}, kinds)
    for test in reply["tests"]:
        plan.plain[test["id"]] = all(call["plain"] for call in test["calls"])
        plan.calls[test["id"]] = [] if plan.plain[test["id"]] else test["calls"]
        if not test["passed"]:
            plan.problems.append(f"{exercise.name}: solution test {test['id']} fails: {test['reason']}")
    return plan


class AnswerProxy:
    """Stands for one of the learner's functions in a test running in the grader."""

    def __init__(self, name: str, sandbox_call):
        self._name, self._call = name, sandbox_call

    def __call__(self, *args, **kwargs):
        tensors = codec.tensors_in((args, kwargs))
        reply = self._call({"op": "call", "name": self._name, "args": codec.encode(list(args)),
                            "kwargs": codec.encode(kwargs)})
        for index, data in _checked_list(reply.get("mutated", [])):
            changed = codec.decode_tensor(data) if type(data) is dict else None
            if type(index) is int and 0 <= index < len(tensors) and changed is not None:
                _assign(tensors[index], changed)
        if "raised" in reply:
            raise codec.decode_error(reply["raised"])
        return codec.decode(reply.get("value"))

    @property
    def __code__(self):
        """What `f.__code__.co_names` tests need: the names the learner's function uses."""
        names = self._call({"op": "code_names", "name": self._name}).get("names")
        if type(names) is not list or not all(type(n) is str for n in names):
            raise codec.MalformedData("code names are not a list of strings")
        return types.SimpleNamespace(co_names=tuple(names))

    def __repr__(self):
        return f"<the submission's {self._name}>"


def _checked_list(value) -> list:
    if type(value) is not list or not all(type(v) is list and len(v) == 2 for v in value):
        raise codec.MalformedData("'mutated' is not a list of [index, tensor] pairs")
    return value


def _assign(tensor: torch.Tensor, value: torch.Tensor):
    """The learner's function changed an argument in place: make the grader's copy match."""
    with torch.no_grad():
        if value.shape == tensor.shape and value.dtype == tensor.dtype:
            tensor.copy_(value)
        else:
            tensor.data = value


def grader_namespace(exercise, plan: Plan, sandbox_call) -> dict:
    """The namespace plain tests run in: the solution's setup, the learner's answers as proxies."""
    namespace = {"__name__": "__main__"}
    answers = {}
    for name in exercise.answer_names:
        if plan.kinds.get(name) == "value":
            try:
                answers[name] = codec.decode(sandbox_call({"op": "value", "name": name}).get("value"))
            except (RequestFailed, SandboxFailure, codec.MalformedData):
                continue  # missing or not plain data: the tests say NameError
        else:
            answers[name] = AnswerProxy(name, sandbox_call)
    namespace.update(answers)
    with quiet():
        for cell in exercise.setup:
            run_test(cell, namespace, "setup")  # a cell calling an unfinished answer: the tests will say
    namespace.update(answers)
    return namespace


@contextlib.contextmanager
def quiet():
    """Setup cells print; the grader's own output stays clean."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def run_in_grader(test, namespace) -> tuple[bool, str | None]:
    with quiet():
        return run_test(test.source, namespace, test.id)


def beside_verdict(test, expected_calls: list, got: dict) -> tuple[bool, str | None]:
    """A test run beside the learner's answers: its asserts, then their log against the solution's.

    The asserts come first so that a learner whose code fails them reads the test's own hint,
    not the first number in which their results differ from the solution's."""
    calls = got.get("calls")
    if type(calls) is not list:
        return False, "the sandbox sent no log of calls"
    if got.get("passed") is not True:
        return False, trusted_reason(test.source, got.get("reason"))
    reason = compare_calls(expected_calls, calls)
    if reason:
        return False, reason
    return True, None


def trusted_reason(source: str, reason) -> str:
    """The sandbox's reason, only if it starts with a message the test itself spells out."""
    if type(reason) is str:
        for fragment in _message_fragments(source):
            if reason.startswith(fragment):  # what follows is a formatted value: keep it short
                return first_line(reason[:len(fragment) + 80], 300)
    return "the test's own checks failed when run beside your code"


def _message_fragments(source: str) -> list[str]:
    fragments = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            fragments.append(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            fragments.append(node.values[0].value)
    return sorted((f for f in fragments if len(f) >= 8), key=len, reverse=True)


def compare_calls(expected: list, got: list) -> str | None:
    """Why the learner's log of calls differs from the solution's (None if it matches)."""
    for number, (want, have) in enumerate(zip(expected, got), 1):
        if type(have) is not dict or have.get("call") != want.get("call"):
            return f"call {number}: expected a call of {want.get('call')}, the log shows something else"
        where = f"call {number} of {want['call']}"
        if "raised" in want or "raised" in have:
            want_error = (want.get("raised") or {}).get("type")
            have_error = (have.get("raised") or {}).get("type") if type(have.get("raised")) is dict else None
            if want_error != have_error:
                said = f"raised {have_error}" if have_error else "returned"
                return f"{where} {said}; the solution " + (f"raises {want_error}" if want_error else "returns")
        else:
            difference = differs(want.get("result"), have.get("result"))
            if difference:
                return f"{where}: the result {difference}"
        difference = differs(want.get("after"), have.get("after"))
        if difference:
            return f"{where}: afterwards, the arguments' state {difference}"
    if len(got) != len(expected):
        return f"the test made {len(got)} call(s) of your functions; with the solution it makes {len(expected)}"
    return None


def differs(want, have, path: str = "") -> str | None:
    """How `have` (from the sandbox) differs from `want` (from the solution), or None."""
    at = f" at {path}" if path else ""
    if type(want) is float or type(have) is float:
        if type(have) not in (int, float) or type(want) not in (int, float):
            return f"is {_kind(have)}{at}, the solution's is {_kind(want)}"
        if not (math.isclose(want, have, rel_tol=RTOL, abs_tol=ATOL) or math.isnan(want) and math.isnan(have)):
            return f"is {have!r}{at}, the solution's is {want!r}"
        return None
    if type(want) is not dict or type(have) is not dict:
        if type(want) is list and type(have) is list:
            return _differs_items(want, have, path)
        if want == have and type(want) is type(have):
            return None
        if _is_zero_grad(want, have) or _is_zero_grad(have, want):
            return None
        return f"is {_kind(have)}{at}, the solution's is {_kind(want)}"
    if want.get("$") != have.get("$"):
        return f"is {_kind(have)}{at}, the solution's is {_kind(want)}"
    if want.get("$") == "tensor":
        return _differs_tensor(want, have, at)
    keys = sorted(set(want) | set(have), key=str)
    for key in keys:
        if key == "$":
            continue
        inner = differs(want.get(key), have.get(key), path if key == "items" else f"{path}.{key}" if path else key)
        if inner:
            return inner
    return None


def _differs_items(want: list, have: list, path: str) -> str | None:
    if len(want) != len(have):
        return f"has {len(have)} items at {path or 'top'}, the solution's has {len(want)}"
    for index, (a, b) in enumerate(zip(want, have)):
        inner = differs(a, b, f"{path}[{index}]")
        if inner:
            return inner
    return None


def _differs_tensor(want: dict, have: dict, at: str) -> str | None:
    try:
        a, b = codec.decode_tensor(want), codec.decode_tensor(have)
    except codec.MalformedData as error:
        return f"is not a valid tensor{at} ({error})"
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"is a {b.dtype} tensor of shape {tuple(b.shape)}{at}, the solution's is {a.dtype} {tuple(a.shape)}"
    if a.is_floating_point():
        a64, b64 = a.double(), b.double()
        if torch.allclose(a64, b64, rtol=RTOL, atol=ATOL, equal_nan=True):
            return None
        gap = (a64 - b64).abs().nan_to_num(math.inf).max().item() if a.numel() else 0.0
        return f"differs{at} by up to {gap:.3g}"
    return None if torch.equal(a, b) else f"differs{at}"


def _is_zero_grad(none, tensor) -> bool:
    """A gradient set to None and one zeroed in place mean the same to every optimizer."""
    if none is not None or type(tensor) is not dict or tensor.get("$") != "tensor":
        return False
    try:
        return not codec.decode_tensor(tensor).any().item()
    except codec.MalformedData:
        return False


def _kind(value) -> str:
    if type(value) is dict:
        return {"tensor": "a tensor", "raised": "an exception"}.get(value.get("$"), f"a {value.get('$')}")
    return "None" if value is None else f"a {type(value).__name__}"


class SandboxFailure(Exception):
    """The submission's process died, stalled or flooded while the test waited on it."""
