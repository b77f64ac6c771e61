"""A learner's path through an exercise, in a real JupyterLab in headless Chromium.

Open exercises/ex00_bytes.ipynb from the lab `make lab` serves, type an answer into the cell
marked YOUR CODE HERE, run `check()`, and read the score table from the page: first with a
correct answer (every visible test passes), then with a wrong one (the failing tests show
their hints). Screenshots of both tables go to artifacts/browser/.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from lab_page import LessonPage
from notebook_times import backstop_s
from mpcourse.grading.judging.exercise import has_code, is_test_cell, visible
from mpcourse.grading.judging.release import STUB

ROOT = Path(__file__).resolve().parents[2]
EXERCISE = ROOT / "exercises" / "ex00_bytes.ipynb"
CORRECT = ("def tensor_bytes(numel, dtype):\n"
           "    return numel * torch.empty((), dtype=dtype).element_size()\n")
#: A learner who forgets that 16-bit formats take 2 bytes: right for fp32 only.
FOUR_BYTES_ALWAYS = "def tensor_bytes(numel, dtype):\n    return numel * 4\n"


def visible_tests(path: Path) -> dict[str, float]:
    """grade_id -> points of each test cell a learner can see (and `check()` runs)."""
    cells = nbformat.read(path, as_version=4).cells
    return {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
            for c in cells if is_test_cell(c) and has_code(visible(c.source))}


def answer_cell(path: Path) -> int:
    """The index (among all cells) of the cell holding the stub the learner replaces."""
    cells = nbformat.read(path, as_version=4).cells
    return next(i for i, c in enumerate(cells) if STUB[0] in c.source)


def score_table(exercise: LessonPage) -> dict[str, list[str]]:
    """The table `check()` shows, read from the page: first column -> the other columns."""
    table = exercise.output_of("table").locator("table")
    rows = table.locator("tbody tr, tfoot tr")
    return {cells[0]: cells[1:] for cells in
            ([td.strip() for td in rows.nth(i).locator("td, th").all_inner_texts()]
             for i in range(rows.count()))}


def test_exercise_scored_in_jupyterlab(lab, browser_context, artifacts):
    before = EXERCISE.read_bytes()
    tests = visible_tests(EXERCISE)
    total = sum(tests.values())
    stub = answer_cell(EXERCISE)
    exercise = LessonPage(browser_context, lab, EXERCISE)
    try:
        exercise.open()
        exercise.replace_code(stub, CORRECT)
        cells = exercise.run_all(timeout_s=backstop_s([EXERCISE]))
        assert not [c for c in cells if c.errors], \
            "with a correct answer no cell may fail: " + "; ".join(e for c in cells for e in c.errors)
        table = score_table(exercise)
        exercise.screenshot(artifacts / "ex00-correct-score.png", exercise.output_of("table"))
        for test, points in tests.items():
            assert table[test][:2] == [f"{points:g}/{points:g}", "pass"], f"{test}: the page shows {table[test]}"
        assert table["total"][0] == f"{total:g}/{total:g}", f"total: the page shows {table['total']}"

        exercise.replace_code(stub, FOUR_BYTES_ALWAYS)
        exercise.run_cell(stub)
        exercise.run_cell(exercise.n_cells - 1)   # the last cell: check()
        exercise.output_of("table").locator("td", has_text="fail").first.wait_for(timeout=60_000)
        table = score_table(exercise)
        exercise.screenshot(artifacts / "ex00-wrong-answer-hints.png", exercise.output_of("table"))
        assert table["fp32_ten_million"][1] == "pass", f"4 bytes is right for fp32: {table['fp32_ten_million']}"
        for test in set(tests) - {"fp32_ten_million"}:
            points, result, hint = table[test]
            assert (points, result) == (f"0/{tests[test]:g}", "fail"), f"{test}: the page shows {table[test]}"
            assert "2" in hint and hint != "AssertionError", f"{test}: no useful hint on the page: {hint!r}"
        assert "take 2 bytes each" in table["fp16_ten_million"][2]
        assert table["total"][0] == f"{tests['fp32_ten_million']:g}/{total:g}"
    finally:
        exercise.close()
    assert EXERCISE.read_bytes() == before, "the browser test changed the exercise on disk (autosave must be off)"
