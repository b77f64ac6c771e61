"""`check()`: the learner's score, live, from inside the exercise notebook."""
from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path

import nbformat

from mpcourse.grading.judging import checkable, judge
from mpcourse.grading.judging.exercise import (BEGIN_SOLUTION, END_SOLUTION, Exercise, Test, defined_names,
                                                has_solution, without_markers)
from mpcourse.grading.judging.release import STUB
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


def check(exercise: str | os.PathLike | None = None, release: str | None = None) -> Score:
    """Run this exercise's visible tests against the definitions in the running notebook.

    `exercise` is the exercise's name, as the check() cell that release writes passes it
    (`check("ex01_bf16_rounding", release=...)`), or a notebook's path. The tests come from the
    notebook's file where the kernel can find it (Jupyter names it; else the working folder holds
    it), and otherwise from the package's copy of the released tests (`checkable`), as in Colab
    and Kaggle, which keep the notebook away from the kernel: both are the same tests. `release`,
    the fingerprint of the tests the notebook was released with, must match the package's.

    The tests run as the grader runs them (`judge`): the released setup cells build their
    namespace, and the learner's functions are called through the same data the sandbox
    serves, so a test sees the same types and changes here as when the work is graded.
    """
    shell = _shell()
    if isinstance(exercise, os.PathLike) or (isinstance(exercise, str) and exercise.endswith(".ipynb")):
        path = Path(exercise)
        found = checkable.from_notebook(nbformat.read(path, as_version=4), path.stem)
    else:
        found = _find(exercise, release, shell)
    if hasattr(shell, "run_cell"):  # in the learner's kernel, as in the grader's sandbox (not in a test run)
        write_yourself(found.write_yourself)
    as_graded = Exercise(found.exercise, found.setup, found.answers,
                         tuple(Test(t.id, t.points, t.source, t.source) for t in found.tests))
    namespace, _ = judge.grader_namespace(as_graded,
                                          judge.local_call(shell.user_ns if shell is not None else {}))
    verdicts = judge.run_tests(as_graded.tests, namespace, show_source=True)
    return Score(tuple(TestResult(t.id, t.points if passed else 0.0, t.points, passed, reason)
                       for t, (passed, reason) in zip(as_graded.tests, verdicts)), found.hidden_points)


def _find(exercise: str | None, release: str | None, shell) -> checkable.Checkable:
    """The tests of the named exercise (or, unnamed, of the notebook found): from its file where
    one is found, else the package's copy. A name the package does not know, or a release
    fingerprint other than its own, raises whether or not the file is at hand."""
    if exercise is None and release is not None:
        raise ValueError(f"check(release={release!r}) needs the exercise's name too: "
                         f"check(\"exNN_topic\", release={release!r})")
    packaged = checkable.shipped(exercise, release) if exercise is not None else None
    path = _this_notebook(shell, exercise)
    if path is not None:
        return checkable.from_notebook(nbformat.read(path, as_version=4), path.stem)
    if packaged is None:
        names = checkable.known()
        raise ValueError(f"check() found no exercise notebook in {Path.cwd()} and was not told which "
                         f"exercise this is: name it, e.g. check(\"{names[0]}\") (the exercises are "
                         f"{', '.join(names)}), or pass the notebook's path")
    return packaged


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _this_notebook(shell, exercise: str | None) -> Path | None:
    """The notebook file this kernel runs, or None where none is found.

    Jupyter tells the kernel its notebook's path; other runners (nbval, nbclient) don't, so then
    the notebook is the exercise in the working folder whose cells this kernel has run, or
    whose answers it has defined. Named, only a notebook of that exercise counts. Two that
    fit equally well are ambiguous: unnamed, that raises; named, the package's copy decides.
    """
    session = os.environ.get("JPY_SESSION_NAME") or (shell.user_ns.get("__session__") if shell else None)
    if session and session.endswith(".ipynb") and Path(session).is_file() and _is(Path(session), exercise):
        return Path(session)
    if shell is None:
        return None
    executed = {source.strip() for source in shell.user_ns.get("In", []) if source.strip()}
    scores = {}
    for candidate in sorted(Path.cwd().glob("*.ipynb")):
        try:
            nb = nbformat.read(candidate, as_version=4)
        except Exception:
            continue
        if not _is(candidate, exercise, nb):
            continue
        cells = [c for c in nb.cells if c.cell_type == "code"]
        ran = sum(1 for c in cells if c.source.strip() in executed)
        answers = [name for c in cells if has_solution(c) or STUB[0] in c.source
                   for name in _names(c.source)]
        defined = sum(1 for name in answers if name in shell.user_ns)
        if ran or (answers and defined == len(answers)):
            scores[candidate] = (ran, defined)
    ranked = sorted(scores, key=scores.get, reverse=True)
    if len(ranked) > 1 and scores[ranked[0]] == scores[ranked[1]]:
        if exercise is None:
            raise ValueError(f"check() could not tell which notebook is running, {ranked[0].name} or "
                             f"{ranked[1].name}: pass its path, e.g. check({ranked[0].name!r})")
        return None
    return ranked[0] if ranked else None


def _is(path: Path, exercise: str | None, nb=None) -> bool:
    """Whether the notebook at `path` is the named exercise (any exercise, unnamed): its released
    metadata says so, or a solution's file name."""
    if exercise is None:
        return True
    try:
        nb = nb or nbformat.read(path, as_version=4)
    except Exception:
        return False
    return nb.metadata.get("mpcourse", {}).get("exercise", path.stem) == exercise


def _names(source: str) -> list[str]:
    try:
        return defined_names(without_markers(source, BEGIN_SOLUTION, END_SOLUTION))
    except SyntaxError:
        return []
