"""`check()`: the learner's score, live, from inside the exercise notebook."""
from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path

import nbformat

from mpcourse.grading.exercise import (BEGIN_SOLUTION, END_SOLUTION, defined_names, has_code, has_solution,
                                       is_test_cell, visible, without_markers)
from mpcourse.grading.release import STUB
from mpcourse.grading.stubs import write_yourself
from mpcourse.grading.verdict import run_test


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
    its path.
    """
    shell = _shell()
    path = Path(notebook) if notebook else _this_notebook(shell)
    nb = nbformat.read(path, as_version=4)
    if hasattr(shell, "run_cell"):  # in the learner's kernel, as in the grader's sandbox (not in a test run)
        write_yourself(nb.metadata.get("mpcourse", {}).get("write_yourself", ()))
    # One namespace for all tests, in notebook order, as when the cells run: a test may use a
    # helper an earlier test cell defined. It is a copy, so the learner's own names stay put.
    namespace = dict(shell.user_ns) if shell is not None else {}
    results, hidden_points = [], 0.0
    for cell in nb.cells:
        if not is_test_cell(cell):
            continue
        meta = cell.metadata["nbgrader"]
        points, source = float(meta["points"]), visible(cell.source)
        if not has_code(source):
            hidden_points += points
            continue
        passed, reason = run_test(source, namespace, meta["grade_id"])
        results.append(TestResult(meta["grade_id"], points if passed else 0.0, points, passed, reason))
    if not results and not hidden_points:
        raise ValueError(f"{path} has no graded test cells, so there is nothing to check")
    return Score(tuple(results), hidden_points)


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
