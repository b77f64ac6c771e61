"""Verdicts computed outside the learner's interpreter.

A solution's test cells are plain `assert` code. The grader runs each in one of two ways,
chosen once per exercise by running the instructor's solution (`calibrate`, in a fresh process
no submission touches):

- **in the grader** (a "plain" test): every answer it calls only takes and returns plain data
  (`codec`). The test's code runs here, in the grader's process; each answer name is an
  `AnswerProxy` that sends the arguments to the submission's sandbox, where the learner's
  function runs on its own copy of them, and decodes the reply. The asserts then run on genuine
  values. The test's code, hidden lines included, never enters the sandbox.
- **beside the answers** (a "model test": it hands the learner's code a model, an optimizer or a
  closure): the test, rewritten by `checks.split_test`, runs in a fresh sandboxed process that
  has run the setup and every code cell of the learner. It logs the values each check is made
  of; the verdict is the test's own conditions evaluated here on those values, each value also
  swapped for the solution's (`beside_verdict`). No pass or fail crosses the sandbox's wall, and
  neither do the conditions, their constants or the messages.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import types
from dataclasses import dataclass, field

import torch

from mpcourse.grading import codec
from mpcourse.grading.checks import Check, SplitTest, decode_leaf, setup_imports, split_tests
from mpcourse.grading.sandbox import Limits, RequestFailed, Sandbox
from mpcourse.grading.verdict import bounded, run_test


@dataclass
class Plan:
    """How each test of one exercise is run, from running the solution once."""
    plain: dict[str, bool]                # test id -> runs in the grader
    splits: dict[str, SplitTest]          # test id -> the test as a model test runs it
    checks: list[Check]                   # every test's checks, numbered across the exercise
    reference: dict[str, dict]            # test id -> the solution's log of its checks
    kinds: dict[str, str]                 # answer name -> "callable" or "value"
    problems: list[str] = field(default_factory=list)  # solution tests that failed
    in_place: tuple[str, ...] = ()        # answers whose exercise asks them to change an argument
    imports: dict = field(default_factory=dict)  # names the setup imports (`checks.setup_imports`)


def calibrate(exercise, deadline: float, limits: Limits, sandboxed: bool = True) -> Plan:
    """Run the instructor's solution in a fresh process, sandboxed like a submission (a solutions
    folder is data too), and plan each test."""
    imports = setup_imports(exercise.setup)
    split, checks = split_tests([t.source for t in exercise.tests], imports)
    splits = {t.id: s for t, s in zip(exercise.tests, split)}
    with Sandbox(limits, deadline, sandboxed=sandboxed, trusted=not sandboxed) as worker:
        reply = record_beside(worker, exercise, list(exercise.answer_cells), exercise.tests, splits, deadline,
                              log_calls=True)
        kinds = worker.request({"op": "describe", "names": list(exercise.answer_names)}, deadline)["kinds"]
    plan = Plan({}, splits, checks, {}, kinds, in_place=exercise.in_place,
                imports=imports)
    for test, got in zip(exercise.tests, reply["tests"]):
        plan.plain[test.id] = all(call["plain"] for call in got["calls"])
        plan.reference[test.id] = None
        passed, reason = beside_verdict(plan, test.id, got)
        plan.reference[test.id] = got
        # A plain test runs in the grader, where the library is whole; in the sandbox, beside the
        # stubs of what the exercise asks for (`stubs`), its reference may be one of them.
        if not passed and not plan.plain[test.id]:
            plan.problems.append(f"{exercise.name}: solution test {test.id} fails: {reason}")
    return plan


def record_beside(worker, exercise, cells: list[str], tests, splits: dict, deadline: float,
                  log_calls: bool = False) -> dict:
    """Run `tests` as model tests in `worker`: the setup and `cells` first, then the rewritten
    tests, which reach the process only after every cell of the learner has run."""
    loaded = worker.request({"op": "load", "setup": list(exercise.setup), "cells": cells,
                             "write_yourself": list(exercise.write_yourself)}, deadline)
    reply = worker.request({"op": "record", "answers": list(exercise.answer_names), "log_calls": log_calls,
                            "tests": [[t.id, splits[t.id].source] for t in tests]}, deadline)
    return dict(reply, errors=loaded.get("errors"))


class AnswerProxy:
    """Stands for one of the learner's functions in a test running in the grader."""

    def __init__(self, name: str, sandbox_call, in_place: bool = False, watch: tuple = ()):
        self._name, self._call, self._in_place, self._watch = name, sandbox_call, in_place, watch
        self.evidence: set[str] = set()

    def __call__(self, *args, **kwargs):
        """The learner's function runs on its own copy of the arguments. Only where the exercise
        asks for an in-place API do its changes come back, for the test to compare explicitly."""
        tensors = codec.tensors_in((args, kwargs))
        reply = self._call({"op": "call", "name": self._name, "args": codec.encode(list(args)),
                            "kwargs": codec.encode(kwargs), "watch": list(self._watch)})
        evidence = reply.get("evidence")
        if self._watch and type(evidence) is list:
            self.evidence.update(bounded(e, 60) for e in evidence[:8] if type(e) is str)
        for index, data in _checked_list(reply.get("mutated", [])):
            changed = codec.decode_tensor(data) if type(data) is dict and self._in_place else None
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
            answers[name] = AnswerProxy(name, sandbox_call, name in plan.in_place, exercise.by_hand.get(name, ()))
    namespace.update(answers)
    with quiet():
        for cell in exercise.setup:
            run_test(cell, namespace, "setup")  # a cell calling an unfinished answer: the tests will say
    namespace.update(answers)
    return namespace


def evidence_notes(namespace: dict) -> list[str]:
    """Notes for the instructor: answers the exercise asks to write by hand during whose calls
    torch's own cast made the dtype in question. Evidence, not a verdict: the learner's process
    reports it, and could hide it."""
    notes = []
    for name, value in namespace.items():
        if isinstance(value, AnswerProxy) and value.evidence:
            notes.append(f"evidence, not a verdict: while {name} ran, torch's own cast did the work the exercise "
                         f"asks for by hand ({', '.join(sorted(value.evidence)[:3])})")
    return notes


@contextlib.contextmanager
def quiet():
    """Setup cells print; the grader's own output stays clean."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def run_in_grader(test, namespace) -> tuple[bool, str | None]:
    with quiet():
        return run_test(test.source, namespace, test.id, show_source=False)


def beside_verdict(plan: Plan, test_id: str, got: dict) -> tuple[bool, str | None]:
    """A model test's verdict from its log: each check's condition on the learner's values, and on
    them with each value swapped for the solution's (none while judging the solution itself)."""
    for module, _ in plan.imports.values():  # what values may be made of (their dataclasses)
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    checks, reference = plan.checks, plan.reference.get(test_id)
    entries, raised = got.get("checks"), got.get("raised")
    if type(entries) is not list or not all(type(e) is dict for e in entries):
        return False, "the sandbox sent no log of this test's checks"
    theirs = _by_check(reference.get("checks") if reference else [])
    seen: dict[int, int] = {}
    for entry in entries:
        number, leaves, names = entry.get("k"), entry.get("leaves"), entry.get("names")
        if type(number) is not int or not 0 <= number < len(checks) or type(leaves) is not list \
                or type(names) is not dict:
            return False, "the sandbox sent a malformed log of this test's checks"
        occurrence = seen[number] = seen.get(number, -1) + 1
        check = checks[number]
        try:
            mine = [decode_leaf(v) for v in leaves]
            reference_leaves = theirs.get(number, [])
            solution = ([decode_leaf(v) for v in reference_leaves[occurrence]]
                        if occurrence < len(reference_leaves) else None)
        except codec.MalformedData as error:
            return False, f"the sandbox sent a malformed value ({bounded(error)})"
        if not check.passes(mine, solution):
            values = {}
            for name in (n for n in check.names if n in names):
                try:
                    values[name] = decode_leaf(names.get(name))
                except codec.MalformedData:
                    continue
            against = " (your values pass alone but not beside a correct run's)" if check.holds(mine) else ""
            return False, check.explain(values, mine) + against
    if type(raised) is dict and not (reference and reference.get("raised")):
        return False, f"the test stopped: {_raised_name(raised)} was raised while it ran your code"
    if any(seen.get(number, -1) + 1 < len(leaves) for number, leaves in theirs.items()):
        return False, "the test stopped before all of its checks ran"
    return True, None


def _by_check(entries) -> dict[int, list]:
    out: dict[int, list] = {}
    for entry in entries or []:
        out.setdefault(entry["k"], []).append(entry["leaves"])
    return out


def _raised_name(raised: dict) -> str:
    name = raised.get("type")
    return name[:60] if type(name) is str and name.isidentifier() else "an exception"


class SandboxFailure(Exception):
    """The submission's process died, stalled or flooded while the test waited on it."""
