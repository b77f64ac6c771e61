"""`check()`: the learner's score, live, from inside the exercise notebook."""
from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import nbformat

from mpcourse.grading.judging import judge
from mpcourse.grading.judging.exercise import (BEGIN_SOLUTION, END_SOLUTION, Test, defined_names, has_code,
                                                has_solution, is_test_cell, visible, without_markers)
from mpcourse.grading.judging.release import STUB, check_metadata
from mpcourse.grading.judging.stubs import write_yourself


@dataclass(frozen=True)
class TestResult:
    id: str
    points: float
    max_points: float
    passed: bool
    reason: str | None


@dataclass(frozen=True)
class Score:
    """Test results with a total; shows itself as a table in a notebook."""
    results: tuple[TestResult, ...]
    hidden_points: float = 0.0

    @property
    def score(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def max_score(self) -> float:
        return sum(r.max_points for r in self.results)

    def __repr__(self) -> str:
        rows = [f"{'test':<28}{'points':>8}  result  hint"]
        for r in self.results:
            rows.append(f"{r.id:<28}{_points(r):>8}  {'pass' if r.passed else 'FAIL':<6}  {r.reason or ''}")
        rows.append(f"{'total':<28}{self.score:g}/{self.max_score:g}{self._hidden_note()}")
        return "\n".join(rows)

    def _hidden_note(self) -> str:
        points = "point" if self.hidden_points == 1 else "points"
        return (f"   (hidden tests worth {self.hidden_points:g} more {points} run when your work is graded)"
                if self.hidden_points else "")

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(r.id)}</td><td>{_points(r)}</td>"
            f"<td style='color:{'green' if r.passed else 'crimson'}'>{'pass' if r.passed else 'fail'}</td>"
            f"<td>{html.escape(r.reason or '')}</td></tr>" for r in self.results)
        return ("<table><thead><tr><th>test</th><th>points</th><th>result</th><th>hint</th></tr></thead>"
                f"<tbody>{rows}</tbody><tfoot><tr><th>total</th><th>{self.score:g}/{self.max_score:g}</th>"
                f"<th></th><th>{html.escape(self._hidden_note().strip())}</th></tr></tfoot></table>")


def _points(r: TestResult) -> str:
    return f"{r.points:g}/{r.max_points:g}"


def check(notebook: str | os.PathLike | None = None) -> Score:
    """Run this exercise's visible tests against the definitions in the running notebook.

    The notebook is found from the session Jupyter gives the kernel; outside JupyterLab, pass
    its path. The tests run as the grader runs them (`judge`): the released setup cells build
    their namespace, and the learner's functions are called through the same data the sandbox
    serves, so a test sees the same types and changes here as when the work is graded.
    """
    shell = _shell()
    path = Path(notebook) if notebook else _this_notebook(shell)
    nb = nbformat.read(path, as_version=4)
    meta = nb.metadata.get("mpcourse", {})
    if hasattr(shell, "run_cell"):  # in the learner's kernel, as in the grader's sandbox (not in a test run)
        write_yourself(meta.get("write_yourself", ()))
    if ("answers" not in meta or "setup" not in meta) and any(has_solution(c) for c in nb.cells):
        meta = {**meta, **check_metadata(nb)}  # a solution notebook: what release would write
    if "answers" not in meta or "setup" not in meta:
        raise ValueError(f"{path} lacks the metadata `mpcourse release` writes (its answers and setup cells): "
                         "take a fresh copy of the exercise")
    tests, hidden_points = [], 0.0
    for cell in nb.cells:
        if not is_test_cell(cell):
            continue
        meta_test = cell.metadata["nbgrader"]
        points, source = float(meta_test["points"]), visible(cell.source)
        if has_code(source):
            tests.append(Test(meta_test["grade_id"], points, source, source))
        else:
            hidden_points += points
    if not tests and not hidden_points:
        raise ValueError(f"{path} has no graded test cells, so there is nothing to check")
    setup_ids = set(meta["setup"])
    exercise = SimpleNamespace(answer_names=tuple(meta["answers"]), by_hand={},
                               setup=[c.source for c in nb.cells if c.get("id") in setup_ids])
    namespace, _ = judge.grader_namespace(exercise, judge.local_call(shell.user_ns if shell is not None else {}))
    verdicts = judge.run_tests(tests, namespace, show_source=True)
    return Score(tuple(TestResult(t.id, t.points if passed else 0.0, t.points, passed, reason)
                       for t, (passed, reason) in zip(tests, verdicts)), hidden_points)


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _this_notebook(shell) -> Path:
    """The notebook this kernel runs.

    Jupyter tells the kernel its notebook's path; other runners (nbval, nbclient) don't, so then
    the notebook is the exercise in the working folder whose cells this kernel has run, or
    whose answers it has defined.
    """
    session = os.environ.get("JPY_SESSION_NAME") or (shell.user_ns.get("__session__") if shell else None)
    if session and session.endswith(".ipynb") and Path(session).is_file():
        return Path(session)
    if shell is None:
        raise ValueError("check() runs inside an exercise notebook; elsewhere pass its path: check('ex00_bytes.ipynb')")
    executed = {source.strip() for source in shell.user_ns.get("In", []) if source.strip()}
    scores = {}
    for candidate in sorted(Path.cwd().glob("*.ipynb")):
        try:
            cells = [c for c in nbformat.read(candidate, as_version=4).cells if c.cell_type == "code"]
        except Exception:
            continue
        ran = sum(1 for c in cells if c.source.strip() in executed)
        answers = [name for c in cells if has_solution(c) or STUB[0] in c.source
                   for name in _names(c.source)]
        defined = sum(1 for name in answers if name in shell.user_ns)
        if ran or (answers and defined == len(answers)):
            scores[candidate] = (ran, defined)
    ranked = sorted(scores, key=scores.get, reverse=True)
    if not ranked or (len(ranked) > 1 and scores[ranked[0]] == scores[ranked[1]]):
        raise ValueError("check() could not tell which notebook is running; pass its path: check('ex00_bytes.ipynb')")
    return ranked[0]


def _names(source: str) -> list[str]:
    try:
        return defined_names(without_markers(source, BEGIN_SOLUTION, END_SOLUTION))
    except SyntaxError:
        return []
