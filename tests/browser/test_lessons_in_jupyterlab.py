"""Every lesson runs in a real JupyterLab in headless Chromium, and its widgets work there.

For each lesson: open it, clear the stored outputs, Run > Run All Cells, and check what a learner
would see: every code cell ran, in order, in a fresh kernel; no cell shows an error (or anything
on stderr); every widget output rendered a widget view. Lessons with interactive widgets are then
driven by clicks and keys (see `WIDGET_CHECKS`). Screenshots go to artifacts/browser/.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from lab_page import LessonPage

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
RUN_ALL_TIMEOUT_S = 600
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def stored_widget_cells(path: Path) -> list[int]:
    """Code cells (numbered among code cells) whose stored outputs include a widget."""
    code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    return [i for i, c in enumerate(code)
            if any(WIDGET_MIME in out.get("data", {}) for out in c.outputs)]


def check_widgets_render(lesson: LessonPage, cells, artifacts: Path) -> None:
    """Every cell that stored a widget shows a rendered widget view (not a text fallback or an
    'Error displaying widget'); screenshot each, and the first figure, for a person to look at."""
    by_index = {c.index: c for c in cells}
    for index in stored_widget_cells(ROOT / "notebooks" / lesson.notebook):
        assert by_index[index].widgets, \
            f"{lesson.notebook}, code cell {index}: no widget rendered; it shows {by_index[index].text!r}"
    stem = Path(lesson.notebook).stem
    widgets = lesson.page.locator(".jp-OutputArea-output").filter(has=lesson.page.locator(".jupyter-widgets"))
    for i in range(widgets.count()):
        lesson.screenshot(artifacts / f"{stem}-widget-{i}.png", widgets.nth(i))
    figures = lesson.page.locator('.jp-OutputArea-output[data-mime-type="image/png"] img')
    if figures.count():
        lesson.screenshot(artifacts / f"{stem}-figure-0.png", figures.first)


#: Lesson number -> a function that drives that lesson's interactive widget after Run All.
WIDGET_CHECKS = {}


@pytest.mark.parametrize("notebook", LESSONS)
def test_lesson_runs_in_jupyterlab(notebook, lab, browser_context, artifacts):
    before = (ROOT / "notebooks" / notebook).read_bytes()
    lesson = LessonPage(browser_context, lab, notebook)
    try:
        lesson.open()
        cells = lesson.run_all(timeout_s=RUN_ALL_TIMEOUT_S)
        stem = Path(notebook).stem
        lesson.screenshot(artifacts / f"{stem}-after-run-all.png")
        failures = [f"code cell {c.index} ({c.prompt}):\n{text}" for c in cells for text in c.errors]
        assert not failures, f"{notebook} shows an error or stderr output in JupyterLab:\n" + "\n".join(failures)
        counts = [c.count for c in cells]
        assert counts == list(range(1, len(cells) + 1)), \
            f"{notebook}: Run All did not run every code cell once, in order: prompts {counts}"
        check_widgets_render(lesson, cells, artifacts)
        check = WIDGET_CHECKS.get(notebook[:2])
        if check:
            check(lesson, artifacts)
    finally:
        lesson.close()
    assert (ROOT / "notebooks" / notebook).read_bytes() == before, \
        f"the browser test changed {notebook} on disk (autosave must be off)"
