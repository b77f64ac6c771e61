"""Reading an exercise notebook: solution regions, test cells, hidden tests.

An exercise is written once, as a solution notebook, in nbgrader's conventions (so a course can
move to nbgrader later): code the learner must write sits between `### BEGIN SOLUTION` and
`### END SOLUTION`; a test cell carries `{"nbgrader": {"grade": true, "grade_id": ..., "points": ...}}`
in its metadata; lines between `### BEGIN HIDDEN TESTS` and `### END HIDDEN TESTS` are tests
the learner does not see.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
EXERCISE_ID = re.compile(r"^(ex\d\d)")


@dataclass(frozen=True)
class Test:
    """One graded test: its id, its points and its code (hidden lines included or not)."""
    id: str
    points: float
    source: str          # hidden lines included
    visible: str = ""    # as the learner's notebook shows it

    def is_this(self, cell) -> bool:
        """Whether a learner's cell is this test's cell: its metadata names the test and its
        content is the test as released. A cell that keeps a test's metadata but holds other
        code (what splitting a test cell leaves behind) is the learner's code."""
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id") if is_test_cell(cell) else None
        return grade_id == self.id and (_same_code(cell.source, self.visible) or _same_code(
            without_markers(cell.source, BEGIN_HIDDEN, END_HIDDEN), self.source))


@dataclass(frozen=True)
class Exercise:
    """What grading needs from a solution notebook."""
    name: str          # e.g. "ex00_bytes"
    setup: tuple[str, ...]  # the notebook's other code cells: imports and data the tests may use
    answer_names: tuple[str, ...]  # names the learner's code must define
    tests: tuple[Test, ...]
    write_yourself: tuple[str, ...] = ()  # library objects the exercise asks for ("module:name", `stubs`)
    by_hand: dict = field(default_factory=dict)  # answer -> dtypes it must make without torch's cast (notes)
    code_cells: tuple[str, ...] = ()  # every code cell but the tests and check(), in order, markers removed

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tests)


def exercise_id(name: str) -> str | None:
    """The `exNN` prefix of a notebook or exercise name, if it has one."""
    match = EXERCISE_ID.match(Path(name).name)
    return match.group(1) if match else None


def is_test_cell(cell) -> bool:
    """Whether a cell's metadata says it is a test (its content decides too: `Test.is_this`)."""
    nbgrader = cell.metadata.get("nbgrader") if cell.cell_type == "code" else None
    return isinstance(nbgrader, dict) and bool(nbgrader.get("grade"))


def _same_code(a: str, b: str) -> bool:
    """Equal but for trailing spaces and blank lines (what editors change)."""
    def lines(text):
        return [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    return lines(a) == lines(b)


#: An exercise's name, as `check()` takes it and release writes it into the check cell.
EXERCISE_NAME = re.compile(r"ex\d\d_[a-z0-9_]+")
#: The check() cell: `check()` (notebooks released before check() could run without the notebook's
#: file), `check("ex01_bf16_rounding")` (a solution) or with the release's fingerprint (`check_line`).
CHECK_CELL = re.compile(r'from mpcourse\.grading import check; check\((?:"ex\d\d_[a-z0-9_]+"'
                        r'(?:, release="[0-9a-f]{12}")?)?\)')


def check_line(exercise: str, release: str | None = None) -> str:
    """The check() cell that names its exercise (and, released, the fingerprint of its tests)."""
    if not EXERCISE_NAME.fullmatch(exercise):
        raise ValueError(f"an exercise's name is exNN_<topic> in lower case, got {exercise!r}")
    return (f'from mpcourse.grading import check; check("{exercise}"'
            + (f', release="{release}")' if release is not None else ")"))


def is_check_cell(cell) -> bool:
    """The notebook's own check() cell, exactly: an import and one call whose arguments are a
    name and a fingerprint in quotes, so it holds no code of the learner's. A cell that quotes it,
    in a comment or beside other code, or calls it otherwise, is the learner's code and runs."""
    return cell.cell_type == "code" and CHECK_CELL.fullmatch(cell.source.strip()) is not None


def has_solution(cell) -> bool:
    return cell.cell_type == "code" and any(line.strip() == BEGIN_SOLUTION
                                            for line in cell.source.splitlines())


def replace_regions(source: str, begin: str, end: str, replacement=None, *, where: str = "cell") -> str:
    """Replace every begin/end region of `source` by `replacement(indent)` lines (or drop it).

    The marker lines themselves go too. Unbalanced markers raise a ValueError naming `where`.
    """
    out, inside, indent = [], False, ""
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped == begin:
            if inside:
                raise ValueError(f"{where}, line {number}: {begin!r} inside another region")
            inside, indent = True, line[: len(line) - len(line.lstrip())]
        elif stripped == end:
            if not inside:
                raise ValueError(f"{where}, line {number}: {end!r} without a matching {begin!r}")
            inside = False
            if replacement is not None:
                out.extend(replacement(indent))
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: {begin!r} is never closed by {end!r}")
    return "\n".join(out)


def without_markers(source: str, begin: str, end: str) -> str:
    """`source` with the marker lines removed and the region's code kept."""
    return "\n".join(line for line in source.splitlines() if line.strip() not in (begin, end))


HIDDEN_NOTE = "# (hidden tests here run only when your work is graded)"


def visible(test_source: str, where: str = "test") -> str:
    """A test's code as the learner sees it: hidden tests replaced by a note saying so."""
    return replace_regions(test_source, BEGIN_HIDDEN, END_HIDDEN, lambda indent: [indent + HIDDEN_NOTE],
                           where=where)


def has_code(source: str) -> bool:
    """Whether `source` holds any statement (a test made only of hidden lines has none)."""
    return bool(ast.parse(source).body)


def load_exercise(path: str | Path) -> Exercise:
    """Parse a solution notebook into setup code, answer names and tests."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    setup, answers, tests, seen, code_cells = [], [], [], set(), []
    for index, cell in enumerate(nb.cells):
        where = f"{path.name}, cell {index}"
        if is_test_cell(cell):
            meta = cell.metadata["nbgrader"]
            test_id, points = meta.get("grade_id"), meta.get("points")
            if not test_id or not isinstance(points, (int, float)) or points <= 0:
                raise ValueError(f"{where}: a test cell needs nbgrader metadata with a grade_id and "
                                 f"positive points, got grade_id={test_id!r}, points={points!r}")
            if test_id in seen:
                raise ValueError(f"{where}: test id {test_id!r} is used twice")
            seen.add(test_id)
            visible(cell.source, where)  # validates the hidden-test markers
            tests.append(Test(test_id, float(points), without_markers(cell.source, BEGIN_HIDDEN, END_HIDDEN),
                              visible(cell.source, where)))
        elif has_solution(cell):
            code = without_markers(cell.source, BEGIN_SOLUTION, END_SOLUTION)
            replace_regions(cell.source, BEGIN_SOLUTION, END_SOLUTION, where=where)  # validates markers
            answers.extend(defined_names(code))
            code_cells.append(code)
        elif cell.cell_type == "code" and not is_check_cell(cell):
            setup.append(cell.source)
            code_cells.append(cell.source)
    if not tests:
        raise ValueError(f"{path.name}: no test cells (cells with nbgrader grade metadata) found")
    meta = nb.metadata.get("mpcourse", {})
    return Exercise(path.stem, tuple(setup), tuple(dict.fromkeys(answers)), tuple(tests),
                    write_yourself=tuple(meta.get("write_yourself", ())),
                    by_hand={k: tuple(v) for k, v in meta.get("by_hand", {}).items()},
                    code_cells=tuple(code_cells))


def learner_cells(nb, exercise: Exercise) -> list[str]:
    """The code cells of a learner's notebook that are the learner's code: all but the check()
    cell and the cells that are the exercise's tests, by metadata and content together."""
    return [c.source for c in nb.cells if c.cell_type == "code" and not is_check_cell(c)
            and not any(test.is_this(c) for test in exercise.tests)]


def defined_names(code: str) -> list[str]:
    """Top-level functions, classes and variables that `code` defines."""
    names = []
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.extend(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def find_solutions(folder: str | Path) -> dict[str, Path]:
    """Solution notebooks of a folder by exercise id (`ex00` -> solutions/ex00_bytes.ipynb)."""
    found = {}
    for path in sorted(Path(folder).glob("ex*.ipynb")):
        key = exercise_id(path.name)
        if key:
            found[key] = path
    return found
