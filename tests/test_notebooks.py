"""Every lesson follows CONTRIBUTING.md: valid, executed in order, no errors, the required sections.

nbval (in `make test`) re-runs the notebooks and compares outputs; this file checks the parts of
the lesson contract that need no kernel.
"""
import re
from pathlib import Path

import nbformat
import pytest

from mpcourse.course import LESSONS

ROOT = Path(__file__).resolve().parents[1]
LESSON_FILES = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTION_FILES = sorted((ROOT / "solutions").glob("*.ipynb"))
SECTIONS = ["## Learning objectives", "## Prerequisites", "## Check your understanding", "## Summary",
            "## Exercise"]


def _read(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return nb


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def test_every_lesson_notebook_is_on_the_course_map():
    on_map = {lesson.notebook for lesson in LESSONS}
    assert LESSON_FILES, "no lessons in notebooks/"
    strays = [p.name for p in LESSON_FILES if p.name not in on_map]
    assert not strays, f"add these lessons to mpcourse/course.py: {strays}"


@pytest.mark.parametrize("path", LESSON_FILES, ids=lambda p: p.name)
def test_lesson_has_the_required_sections_in_order(path):
    nb = _read(path)
    number = path.name[:2]
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith(f"# Lesson {number}: "), \
        f"the first cell must be the title '# Lesson {number}: ...'"
    headings = [line.strip() for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                if line.startswith("## ")]
    positions = []
    for section in SECTIONS:
        found = [i for i, h in enumerate(headings) if h == section]
        assert found, f"{path.name} lacks the section {section!r}"
        positions.append(found[0])
    assert positions == sorted(positions), f"{path.name}: sections out of order: {SECTIONS}"
    teaching = [h for h in headings if re.match(r"## \d+\. ", h)]
    assert len(teaching) >= 2, f"{path.name}: teaching sections are numbered '## 1. ...'"


@pytest.mark.parametrize("path", LESSON_FILES, ids=lambda p: p.name)
def test_lesson_was_executed_in_order_without_errors_or_stderr(path):
    cells = _code_cells(_read(path))
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), \
        f"{path.name}: run it top to bottom in a fresh kernel and save (execution counts {counts})"
    for index, cell in enumerate(cells):
        for out in cell.outputs:
            assert out.output_type != "error", f"{path.name}, code cell {index}: stored an error"
            assert not (out.output_type == "stream" and out.name == "stderr"), \
                f"{path.name}, code cell {index}: printed to stderr: {out.text[:200]!r}"


@pytest.mark.parametrize("path", LESSON_FILES, ids=lambda p: p.name)
def test_lesson_points_to_an_existing_exercise(path):
    nb = _read(path)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    exercise = text[text.index("## Exercise"):]
    named = re.findall(r"exercises/(ex\d\d_\w+\.ipynb)", exercise)
    assert named, f"{path.name}: the Exercise section must name exercises/exNN_<topic>.ipynb"
    for name in named:
        assert (ROOT / "exercises" / name).is_file(), f"{path.name} points to a missing exercise {name}"


@pytest.mark.parametrize("path", SOLUTION_FILES, ids=lambda p: p.name)
def test_solution_notebook_ends_with_the_self_check(path):
    cells = _code_cells(_read(path))
    assert cells[-1].source.strip() == f'from mpcourse.grading import check; check("{path.stem}")', \
        f"{path.name}: the last cell names its exercise, so check() runs where the file is not at hand"
    assert any(c.metadata.get("nbgrader", {}).get("grade") for c in cells), f"{path.name} has no test cells"
