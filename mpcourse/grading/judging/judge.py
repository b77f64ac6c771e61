"""Verdicts computed outside the learner's interpreter, by one code path for the grader and `check()`.

Every test, visible or hidden, runs where the judging happens: in the grader's process (or, for
`check()`, the learner's own kernel). The learner's process only serves calls to the learner's
own functions (`worker.Answers`), with inputs the test chose:

- Each answer name in the test's namespace is an `AnswerProxy`. Calling it sends the arguments
  as data (`states.Sender`): numbers, tensors with their gradients, and the models, optimizers and
  scalers a test hands the learner's code, as their classes and states. The learner's side
  rebuilds them, runs the learner's function, and sends back its result and every object's state
  after the call, which the proxy applies to the test's own objects. So an in-place change to an
  input is seen by the test, in the grader as in `check()`.
- A test's statements, its references (models, optimizers and training loops included) and its
  hidden lines never reach the learner's process: only data does. What a test needs to observe
  inside a call (the dtype of a layer's output...) it asks for by name (`states.watch`).
- `check()` serves the same requests from the kernel's namespace through the same JSON, so the
  test meets the same types in both places and the two give the same verdict test by test.
"""
from __future__ import annotations

import contextlib
import json
import sys
import threading
import types
from dataclasses import dataclass, field

from mpcourse.grading.judging import codec, states
from mpcourse.grading.sandbox.sandbox import RequestFailed
from mpcourse.grading.judging.verdict import NoAnswer, bounded, run_test


class SandboxFailure(NoAnswer):
    """The submission's process died, stalled or flooded while the test waited on it."""


class MalformedAnswer(NoAnswer):
    """What came back from the learner's side is not data of the accepted kinds."""


@dataclass
class Plan:
    """What running the instructor's solution once told about an exercise."""
    problems: list[str] = field(default_factory=list)  # solution tests that failed


def calibrate(exercise, budget, limits, sandboxed: bool = True) -> Plan:
    """Grade the instructor's solution like a submission (its cells in a sandbox: a solutions
    folder is data too, the tests here) and report every test it fails."""
    from mpcourse.grading.sandbox.sandbox import Sandbox
    plan = Plan()
    with Sandbox(limits, budget, sandboxed=sandboxed, trusted=not sandboxed) as worker:
        def request(message):
            return worker.request(message, budget)
        if exercise.write_yourself:
            request({"op": "stub", "targets": list(exercise.write_yourself)})
        for cell in exercise.code_cells:
            request({"op": "run_cell", "source": cell})
        namespace, _ = grader_namespace(exercise, request)
        for test, (passed, reason) in zip(exercise.tests, run_tests(exercise.tests, namespace)):
            if not passed:
                plan.problems.append(f"{exercise.name}: solution test {test.id} fails: {reason}")
    return plan


class AnswerProxy:
    """Stands for one of the learner's functions in a test: its calls go to the learner's side
    as data, and their results and changes come back as data."""

    def __init__(self, name: str, sandbox_call, watch: tuple = ()):
        self._name, self._call, self._watch = name, sandbox_call, watch
        self.evidence: set[str] = set()

    def __call__(self, *args, **kwargs):
        sender = states.Sender()
        message = {"op": "call", "name": self._name, "args": sender.encode(list(args)),
                   "kwargs": sender.encode(kwargs), "watch": list(self._watch)}
        reply = self._call(message)
        try:
            return self._result(sender, reply)
        except codec.MalformedData as error:
            raise MalformedAnswer(f"{self._name} sent back a malformed answer: {error}") from None

    def _result(self, sender, reply):
        fields = set(reply) - {"id"}
        if fields - {"value", "raised", "evidence", "after"} or ("value" in fields) == ("raised" in fields):
            raise codec.MalformedData(f"a reply with fields {sorted(fields)[:6]} is not a call's reply")
        evidence = reply.get("evidence")
        if self._watch and type(evidence) is list:
            self.evidence.update(bounded(e, 60) for e in evidence[:8] if type(e) is str)
        sender.apply(reply.get("after"))
        if "raised" in reply:
            raise codec.decode_error(reply["raised"])
        return sender.decode_result(reply["value"])

    @property
    def __code__(self):
        """What `f.__code__.co_names` tests need: the names the learner's function uses."""
        names = self._call({"op": "code_names", "name": self._name}).get("names")
        if type(names) is not list or not all(type(n) is str for n in names):
            raise codec.MalformedData("code names are not a list of strings")
        return types.SimpleNamespace(co_names=tuple(names))

    def __repr__(self):
        return f"<the submission's {self._name}>"


def grader_namespace(exercise, sandbox_call, run_setup: bool = True) -> tuple[dict, dict]:
    """The namespace tests run in: the solution's setup run here, then the learner's answers,
    each a proxy (a function) or its value as data. Returns it and the proxies."""
    namespace = {"__name__": "__main__"}
    kinds = sandbox_call({"op": "describe", "names": list(exercise.answer_names)}).get("kinds")
    kinds = kinds if type(kinds) is dict else {}
    answers, proxies = {}, {}
    for name in exercise.answer_names:
        if kinds.get(name) == "callable":
            answers[name] = proxies[name] = AnswerProxy(name, sandbox_call, exercise.by_hand.get(name, ()))
        elif kinds.get(name) == "value":
            with contextlib.suppress(SandboxFailure, RequestFailed, codec.MalformedData):
                reply = sandbox_call({"op": "value", "name": name})
                if "value" in reply:  # not plain data: the tests say NameError
                    answers[name] = codec.decode(reply["value"])
    namespace.update(answers)
    if run_setup:
        with quiet():
            for cell in exercise.setup:
                run_test(cell, namespace, "setup")  # a cell calling an unfinished answer: the tests will say
    namespace.update(answers)
    return namespace, proxies


def run_tests(tests, namespace, show_source: bool = False, before_each=None) -> list[tuple[bool, str | None]]:
    """Each test's (passed, reason), in order, in one namespace (a test may use a helper an
    earlier one defined). `show_source` only for the learner's own visible tests."""
    out = []
    for test in tests:
        if before_each is not None:
            before_each()
        with quiet():
            out.append(run_test(test.source, namespace, test.id, show_source=show_source))
    return out


def evidence_notes(proxies: dict) -> list[str]:
    """Notes for the instructor: answers the exercise asks to write by hand during whose calls
    torch's own cast made the dtype in question. Evidence, not a verdict: the learner's process
    reports it, and could hide it."""
    return [f"evidence, not a verdict: while {name} ran, torch's own cast did the work the exercise asks for "
            f"by hand ({', '.join(sorted(proxy.evidence)[:3])})"
            for name, proxy in proxies.items() if proxy.evidence]


def local_call(namespace: dict):
    """`check()`'s side of the wall: the kernel's namespace serves the requests the sandbox
    serves, through the same JSON."""
    from mpcourse.grading.sandbox.worker import Answers
    answers = Answers(namespace)

    def call(message):
        reply = json.loads(json.dumps(answers.handle(json.loads(json.dumps(message)))))
        if "failed" in reply:
            raise RequestFailed(f"the notebook could not serve {message.get('op')!r}: "
                                f"{str(reply['failed'])[:200]}")
        return reply
    return call


class _Router:
    """A standard stream that drops what the threads in `quiet` write and passes the rest on."""

    def __init__(self, real):
        self.real = real

    def write(self, text):
        return len(text) if threading.get_ident() in _quiet_threads else self.real.write(text)

    def __getattr__(self, name):
        return getattr(self.real, name)


_quiet_threads: set[int] = set()
_quiet_lock = threading.Lock()


@contextlib.contextmanager
def quiet():
    """Setup cells print; the grader's own output stays clean. Per thread (exercises are planned
    in parallel threads): `contextlib.redirect_stdout` swaps the stream for every thread, and two
    threads' swaps interleaved would leave the grader's output in a lost buffer."""
    with _quiet_lock:
        if not _quiet_threads:
            sys.stdout, sys.stderr = _Router(sys.stdout), _Router(sys.stderr)
        _quiet_threads.add(threading.get_ident())
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_threads.discard(threading.get_ident())
            if not _quiet_threads and isinstance(sys.stdout, _Router) and isinstance(sys.stderr, _Router):
                sys.stdout, sys.stderr = sys.stdout.real, sys.stderr.real
