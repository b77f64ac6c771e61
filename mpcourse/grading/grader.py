"""`mpcourse grade`: run submissions in their own kernels and score them with the solution's tests.

Each submission runs in a fresh Jupyter kernel (a separate process) in an empty folder, under a
time limit. Its own test cells are ignored: the tests, hidden ones included, come from the
solution notebook, read before any submission runs. Every verdict travels back to this process
as a line tagged with a random nonce, and the grader, not the kernel, adds up the points. The
grader also fingerprints torch, the builtins and `mpcourse.grading` before and after the
submission's code, so a submission that patches them to pass scores zero.
"""
from __future__ import annotations

import csv
import json
import secrets
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from mpcourse.grading import verdict
from mpcourse.grading.selfcheck import TestResult
from mpcourse.grading.exercise import (Exercise, exercise_id, find_solutions, is_check_cell,
                                       is_test_cell, load_exercise)

OUTPUT_LIMIT = 100_000  # characters of output kept per cell; the rest is dropped

FINGERPRINT = """
def __mpcourse_fingerprint():
    import builtins, inspect, json, math, sys, torch, torch.nn.functional, torch.testing, mpcourse.grading
    import torch._dynamo, torch.optim  # loading these rebinds some torch functions: do it before, not during
    watched = {{"builtins": builtins, "math": math, "torch": torch, "torch.nn.functional": torch.nn.functional,
               "torch.testing": torch.testing, "mpcourse.grading": mpcourse.grading}}
    ids = {{name + "." + key: id(value) for name, obj in watched.items()
           for key, value in vars(obj).items() if key not in ("_", "__", "___", "input")}}
    for key in dir(torch.Tensor):  # inherited methods too: patching torch.Tensor.nbytes shadows one
        ids["torch.Tensor." + key] = id(inspect.getattr_static(torch.Tensor, key))
    for name in ("builtins", "math", "torch", "mpcourse", "mpcourse.grading", "mpcourse.grading.verdict"):
        ids["sys.modules[%r]" % name] = id(sys.modules.get(name))
    shell = get_ipython()
    for name in ("run_cell", "run_cell_async", "run_code", "run_ast_nodes", "showtraceback"):
        ids["IPython shell." + name] = id(vars(shell).get(name, getattr(type(shell), name)))
    return json.dumps(ids)
print({nonce!r} + __mpcourse_fingerprint())
del __mpcourse_fingerprint
"""

BASE_NAMESPACE = """
__mpcourse_base = {{"__name__": "__main__"}}
for __mpcourse_name in {answers!r}:
    if __mpcourse_name in globals():
        __mpcourse_base[__mpcourse_name] = globals()[__mpcourse_name]
for __mpcourse_cell in {setup!r}:
    try:
        exec(compile(__mpcourse_cell, "<exercise setup>", "exec"), __mpcourse_base)
    except Exception:
        pass  # a cell that calls an unfinished answer; the tests will say what is wrong
for __mpcourse_name in {answers!r}:  # setup must not shadow the learner's answers
    if __mpcourse_name in globals():
        __mpcourse_base[__mpcourse_name] = globals()[__mpcourse_name]
del __mpcourse_name, __mpcourse_cell
"""

RUN_TEST = """
__mpcourse_verdict = {{}}
exec(compile({verdict_source!r}, "<mpcourse verdict>", "exec"), __mpcourse_verdict)
__mpcourse_verdict["report"]({nonce!r}, *__mpcourse_verdict["run_test"]({source!r}, __mpcourse_base, {test_id!r}))
del __mpcourse_verdict
"""


@dataclass
class SubmissionResult:
    path: str
    exercise: str | None
    score: float
    max_score: float
    error: str | None
    tests: list[TestResult] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("seconds")
        return data


class SubmissionFailed(Exception):
    """The submission as a whole could not be graded; the message is the one-line reason."""


def grade_submission(path: str | Path, exercises: dict[str, Exercise], timeout: float = 120.0) -> SubmissionResult:
    """Score one submitted notebook against the tests of its exercise."""
    start = time.perf_counter()
    path = Path(path)
    exercise, tests, error = None, [], None
    try:
        exercise = exercises.get(exercise_id(path.name))  # known even if the file is unreadable
        nb = _read_submission(path)
        exercise = _exercise_for(path, nb, exercises)
        tests, error = _run(nb, exercise, timeout)
    except SubmissionFailed as failure:
        error = str(failure)
    if exercise is not None and not tests:  # nothing ran: every test scores 0 with the reason
        tests = [TestResult(t.id, 0.0, t.points, False, error) for t in exercise.tests]
    return SubmissionResult(
        path=str(path), exercise=exercise.name if exercise else None,
        score=sum(t.points for t in tests), max_score=exercise.max_score if exercise else 0.0,
        error=error, tests=tests, seconds=time.perf_counter() - start)


def _read_submission(path: Path) -> nbformat.NotebookNode:
    try:
        with warnings.catch_warnings():  # old notebooks without cell ids are still fine to grade
            warnings.simplefilter("ignore")
            nb = nbformat.read(path, as_version=4)
            nbformat.validate(nb)
    except FileNotFoundError:
        raise SubmissionFailed(f"file not found: {path}") from None
    except Exception as error:
        raise SubmissionFailed(f"not a valid .ipynb notebook: {verdict.first_line(error, 200)}") from None
    return nb


def _exercise_for(path: Path, nb, exercises: dict[str, Exercise]) -> Exercise:
    name = nb.metadata.get("mpcourse", {}).get("exercise") or path.stem
    key = exercise_id(name) or exercise_id(path.name)
    if key not in exercises:
        raise SubmissionFailed(f"cannot tell which exercise this is: {path.name!r} does not start with a known "
                               f"exercise id (known: {', '.join(sorted(exercises)) or 'none'})")
    return exercises[key]


def _run(nb, exercise: Exercise, timeout: float) -> tuple[list[TestResult], str | None]:
    """Execute the submission's code, then each test; return the results and the first problem."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    learner_cells = [c.source for c in nb.cells
                     if c.cell_type == "code" and not is_test_cell(c) and not is_check_cell(c)]
    nonce = secrets.token_hex(16)
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="mpcourse-grade-") as workdir:
        kernel = _Kernel(workdir)
        try:
            before = _fingerprint(kernel, nonce, deadline)
            first_error = None
            for source in learner_cells:
                outputs = kernel.run(source, deadline)
                if first_error is None and (err := _error_of(outputs)):
                    first_error = f"a code cell raised {err}"
            tampered = _changes(before, _fingerprint(kernel, nonce, deadline))
            if tampered:
                raise SubmissionFailed("the submission changed what grading relies on: " + ", ".join(tampered[:5]))
            kernel.run(BASE_NAMESPACE.format(setup=exercise.setup, answers=exercise.answer_names), deadline)
            results = [_run_test(kernel, test, nonce, deadline) for test in exercise.tests]
        except CellTimeoutError:
            raise SubmissionFailed(f"timed out: the submission ran longer than {timeout:g} s (an endless loop?)") from None
        except DeadKernelError:
            raise SubmissionFailed("the kernel died (the submission called os._exit or exit(), or crashed)") from None
        finally:
            kernel.close()
    return results, first_error


def _run_test(kernel: "_Kernel", test, nonce: str, deadline: float) -> TestResult:
    outputs = kernel.run(RUN_TEST.format(verdict_source=VERDICT_SOURCE, nonce=nonce,
                                         source=test.source, test_id=test.id), deadline)
    found = _tagged(outputs, nonce)
    if found is None:
        passed, reason = False, "no verdict came back (the submission interfered with the kernel's output)"
    else:
        passed, reason = found["passed"], found["reason"]
    return TestResult(test.id, test.points if passed else 0.0, test.points, passed, reason)


def _fingerprint(kernel: "_Kernel", nonce: str, deadline: float) -> dict:
    outputs = kernel.run(FINGERPRINT.format(nonce=nonce), deadline)
    found = _tagged(outputs, nonce)
    if found is None:
        raise SubmissionFailed("the kernel could not fingerprint torch and mpcourse.grading: "
                               + (_error_of(outputs) or "no output"))
    return found


def _changes(before: dict, after: dict) -> list[str]:
    return [("deleted " if key not in after else "replaced ") + key
            for key, value in before.items() if after.get(key) != value]


def _tagged(outputs, nonce: str):
    for out in outputs:
        if out.get("output_type") == "stream" and out.get("name") == "stdout":
            for line in out.get("text", "").splitlines():
                if line.startswith(nonce):
                    return json.loads(line[len(nonce):])
    return None


def _error_of(outputs) -> str | None:
    for out in outputs:
        if out.get("output_type") == "error":
            return f"{out.get('ename')}: {verdict.first_line(out.get('evalue', ''), 200)}".rstrip(": ")
    return None


class _Kernel:
    """A fresh kernel for one submission, running cells one by one against a shared deadline."""

    def __init__(self, workdir: str):
        from nbclient import NotebookClient

        class CappedClient(NotebookClient):
            def output(self, outs, msg, display_id, cell_index):
                if sum(len(str(o.get("text", ""))) for o in outs) > OUTPUT_LIMIT:
                    return None  # a submission that prints megabytes keeps only the start
                return super().output(outs, msg, display_id, cell_index)

        self.nb = nbformat.v4.new_notebook()
        self.client = CappedClient(self.nb, kernel_name="python3", allow_errors=True,
                                   resources={"metadata": {"path": workdir}}, kernel_manager_class=_manager_class())
        self.client.shutdown_kernel = "immediate"
        self.client.km = self.client.create_kernel_manager()
        self.client.start_new_kernel(cwd=workdir, stderr=subprocess.DEVNULL)
        self.client.start_new_kernel_client()

    def run(self, source: str, deadline: float):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            from nbclient.exceptions import CellTimeoutError
            raise CellTimeoutError("deadline passed")
        cell = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        self.client.timeout = max(1, int(remaining))
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        return cell.outputs

    def close(self):
        try:
            self.client._cleanup_kernel()
        except Exception:
            pass


def _manager_class():
    """A kernel manager whose "python3" kernel is this interpreter, whatever kernels are installed."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class ThisPythonSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                          **ipykernel.kernelspec.get_kernel_dict())

    class ThisPythonKernel(AsyncKernelManager):
        def _kernel_spec_manager_default(self):
            return ThisPythonSpecs(data_dir=self.data_dir)

    return ThisPythonKernel


VERDICT_SOURCE = Path(verdict.__file__).read_text()


def default_solutions() -> Path:
    """`./solutions` when grading from a course checkout, else the one beside the package."""
    here = Path("solutions")
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "solutions"


def load_exercises(folder: str | Path) -> dict[str, Exercise]:
    """Every exercise's tests, read once, before any submission runs."""
    found = find_solutions(folder)
    if not found:
        raise ValueError(f"no solution notebooks (ex*.ipynb) in {str(folder)!r}: pass --solutions DIR")
    return {key: load_exercise(path) for key, path in found.items()}


def grade_command(args) -> int:
    try:
        exercises = load_exercises(args.solutions or default_solutions())
    except ValueError as error:
        print(f"mpcourse grade: {error}", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print(f"mpcourse grade: --timeout must be positive, got {args.timeout}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"mpcourse grade: --jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    results = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(grade_submission, path, exercises, args.timeout) for path in args.paths]
        for future in futures:
            result = future.result()
            results.append(result)
            if not args.json:
                print(format_result(result), flush=True)
    if args.csv:
        write_gradebook(results, args.csv)
    if args.json:
        print(json.dumps({"submissions": [r.to_json() for r in results]}, indent=1))
    else:
        print(format_summary(results))
    return 0


def format_result(r: SubmissionResult) -> str:
    lines = [f"{r.path}  [{r.exercise or '?'}]  {r.score:g}/{r.max_score:g}  ({r.seconds:.1f} s)"]
    if r.error:
        lines.append(f"  note: {r.error}")
    for t in r.tests:
        lines.append(f"  {t.id:<28}{t.points:g}/{t.max_points:g}  {'pass' if t.passed else 'FAIL'}"
                     + (f"  {t.reason}" if t.reason and not t.passed else ""))
    return "\n".join(lines)


def format_summary(results: list[SubmissionResult]) -> str:
    width = max([len(r.path) for r in results] + [10])
    lines = ["", f"{'submission':<{width}}  {'exercise':<22}{'score':>10}{'time':>9}"]
    for r in results:
        lines.append(f"{r.path:<{width}}  {(r.exercise or '?'):<22}{f'{r.score:g}/{r.max_score:g}':>10}{r.seconds:>8.1f}s")
    lines.append(f"{len(results)} submission(s), {sum(r.seconds for r in results):.1f} kernel-seconds")
    return "\n".join(lines)


def write_gradebook(results: list[SubmissionResult], path: str | Path) -> None:
    """One row per submission and test, for a spreadsheet or a learning-management system."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "exercise", "test", "points", "max_points", "passed", "reason",
                         "score", "max_score", "error"])
        for r in results:
            for t in r.tests or [None]:
                writer.writerow([r.path, r.exercise or "", t.id if t else "", t.points if t else 0,
                                 t.max_points if t else 0, t.passed if t else False,
                                 (t.reason or "") if t else "", r.score, r.max_score, r.error or ""])
