"""Every lesson opens in a real JupyterLab in headless Chromium, and its widgets work there.

Each lesson opens with its stored outputs, and none shows an error or stderr. Lessons whose
outputs JupyterLab itself has to bring to life (widgets), and lesson 00, the first a learner
runs, are then run whole: clear the stored outputs, Run > Run All Cells, and check what a
learner would see: every code cell ran, in order, in a fresh kernel; no cell shows an error (or
anything on stderr); every widget output rendered a widget view; the interactive widgets are
driven by clicks and keys (see `WIDGET_CHECKS`). The other lessons' code runs three times under
nbval in `make test` (plain and as on two other CPUs) in the same kernel JupyterLab starts, so
running it a fourth time here would check nothing new. Screenshots go to artifacts/browser/.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from lab_page import LessonPage
from notebook_times import backstop_s

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
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
    for index in stored_widget_cells(ROOT / lesson.notebook):
        assert by_index[index].widgets, \
            f"{lesson.notebook}, code cell {index}: no widget rendered; it shows {by_index[index].text!r}"
    stem = Path(lesson.notebook).stem
    widgets = lesson.page.locator(".jp-OutputArea-output").filter(has=lesson.page.locator(".jupyter-widgets"))
    for i in range(widgets.count()):
        lesson.screenshot(artifacts / f"{stem}-widget-{i}.png", widgets.nth(i))
    figures = lesson.page.locator('.jp-OutputArea-output[data-mime-type="image/png"] img')
    if figures.count():
        lesson.screenshot(artifacts / f"{stem}-figure-0.png", figures.first)


#: How torch stores each format the bits explorer shows: dtype, the integer view, exponent bits.
TORCH_FORMATS = {"fp32": ("float32", "int32", 8), "fp16": ("float16", "int16", 5),
                 "bf16": ("bfloat16", "int16", 8), "fp8_e4m3": ("float8_e4m3fn", "uint8", 4),
                 "fp8_e5m2": ("float8_e5m2", "uint8", 5)}


def torch_bits(value: float, name: str) -> tuple[str, str, str]:
    """Sign, exponent and mantissa bits of `value` stored in format `name`, as torch stores it."""
    import torch
    dtype_name, view_name, exponent_bits = TORCH_FORMATS[name]
    dtype, view = getattr(torch, dtype_name), getattr(torch, view_name)
    stored = torch.tensor(value, dtype=torch.float64).to(dtype).view(view).item()
    width = torch.finfo(dtype).bits
    text = format(stored & (2 ** width - 1), f"0{width}b")
    return text[0], text[1:1 + exponent_bits], text[1 + exponent_bits:]


def check_bits_explorer(lesson: LessonPage, artifacts: Path, value: str = "-0.3") -> None:
    """Lesson 01: type a number into the bits explorer; each format's row shows torch's bits."""
    explorer = lesson.output_of(".mpcourse-bits-explorer")
    lesson.screenshot(artifacts / "01-bits-explorer-before.png", explorer)
    explorer.locator(".mpcourse-bits-number input").fill(value)
    table = explorer.locator(".mpcourse-bits-table pre")
    table.filter(has_text=f"value: {float(value)!r}").wait_for(timeout=30_000)
    lesson.screenshot(artifacts / "01-bits-explorer-after.png", explorer)
    shown = {line.split()[0]: line.split()[1:4] for line in table.inner_text().splitlines()[2:]}
    assert set(shown) == set(TORCH_FORMATS), f"the explorer shows formats {sorted(shown)}"
    for name in TORCH_FORMATS:
        assert tuple(shown[name]) == torch_bits(float(value), name), \
            f"bits explorer, {name} of {value}: shows {shown[name]}, torch stores {torch_bits(float(value), name)}"


def set_slider_to_minimum(panel, description: str) -> None:
    """Focus the slider's handle and press Home, as a keyboard user would."""
    slider = panel.locator(".widget-slider").filter(has=panel.page.locator(f'label:text-is("{description}")'))
    slider.locator(".noUi-handle").focus()
    slider.locator(".noUi-handle").press("Home")
    minimum = slider.locator(".noUi-handle").get_attribute("aria-valuemin")
    expect(slider.locator(".widget-readout")).to_have_text(f"{float(minimum):g}", timeout=30_000)


def expect(locator):
    """Playwright's retrying assertions (imported here: without Playwright the fixtures skip or fail)."""
    from playwright.sync_api import expect as playwright_expect
    return playwright_expect(locator)


def check_control_panel(lesson: LessonPage, artifacts: Path) -> None:
    """Lesson 06: choose bf16, shrink the run to seconds, click Run; the results table gains a bf16 row.

    On a CPU without AVX512-BF16 or AMX, bf16 is emulated and far slower than fp32, so the test
    first sets the size sliders to their minimum: the run takes seconds.
    """
    panel = lesson.output_of("table.mpcourse-results")
    rows = panel.locator("table.mpcourse-results tbody tr")
    before = rows.count()
    panel.locator('.widget-toggle-button:text-is("bf16")').click()
    for description in ("Model width (d_model)", "Batch size", "Steps"):
        set_slider_to_minimum(panel, description)
    lesson.screenshot(artifacts / "06-control-panel-before-run.png", panel)
    run = panel.locator('.widget-button:text-is("Run")')
    run.click()
    expect(rows).to_have_count(before + 1, timeout=180_000)
    expect(run).to_be_enabled(timeout=60_000)
    lesson.screenshot(artifacts / "06-control-panel-after-run.png", panel)
    assert "bf16" in rows.nth(before).inner_text(), f"the new row is not the bf16 run: {rows.nth(before).inner_text()!r}"


#: Lesson number -> a function that drives that lesson's interactive widget after Run All.
WIDGET_CHECKS = {"01": check_bits_explorer, "06": check_control_panel}


def assert_no_errors(notebook: str, cells) -> None:
    """No code cell shows an error or anything on stderr, as a learner would see it."""
    failures = [f"code cell {c.index} ({c.prompt}):\n{text}" for c in cells for text in c.errors]
    assert not failures, f"{notebook} shows an error or stderr output in JupyterLab:\n" + "\n".join(failures)


def runs_whole(notebook: str) -> bool:
    """Lesson 00, and every lesson with a widget (stored, or driven by `WIDGET_CHECKS`)."""
    return (notebook.startswith("00") or notebook[:2] in WIDGET_CHECKS
            or bool(stored_widget_cells(ROOT / "notebooks" / notebook)))


@pytest.mark.parametrize("notebook", [n for n in LESSONS if not runs_whole(n)])
def test_lesson_opens_in_jupyterlab_with_its_outputs(notebook, lab, browser_context, artifacts):
    before = (ROOT / "notebooks" / notebook).read_bytes()
    lesson = LessonPage(browser_context, lab, ROOT / "notebooks" / notebook)
    try:
        lesson.open()
        cells = lesson.code()
        lesson.screenshot(artifacts / f"{Path(notebook).stem}-opened.png")
        assert_no_errors(notebook, cells)
        stored = [c.count for c in cells]
        assert stored == list(range(1, len(cells) + 1)), \
            f"{notebook}: JupyterLab shows the stored prompts {stored}, not every code cell run in order"
    finally:
        lesson.close()
    assert (ROOT / "notebooks" / notebook).read_bytes() == before, \
        f"the browser test changed {notebook} on disk (autosave must be off)"


@pytest.mark.parametrize("notebook", [n for n in LESSONS if runs_whole(n)])
def test_lesson_runs_in_jupyterlab(notebook, lab, browser_context, artifacts):
    before = (ROOT / "notebooks" / notebook).read_bytes()
    lesson = LessonPage(browser_context, lab, ROOT / "notebooks" / notebook)
    try:
        lesson.open()
        cells = lesson.run_all(timeout_s=backstop_s([notebook]))
        stem = Path(notebook).stem
        lesson.screenshot(artifacts / f"{stem}-after-run-all.png")
        assert_no_errors(notebook, cells)
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
