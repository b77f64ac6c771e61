"""The browser test's eyes work: on a notebook with a planted error, a widget and an empty cell,
`LessonPage.run_all` sees the error, the rendered widget, and that Run All stopped at the error.
Without this, a JupyterLab release that renamed a CSS class could turn every lesson check green.
"""
import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from lab_page import LessonPage
from lab_server import start_lab
from notebook_times import backstop_s


def test_run_all_reports_errors_widgets_and_unrun_cells(browser_context, chromium_path, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    nb = new_notebook(cells=[new_code_cell("print('fine')"),
                             new_code_cell("import ipywidgets\nipywidgets.IntSlider(description='planted')"),
                             new_code_cell(""),
                             new_code_cell("raise ValueError('planted error')"),
                             new_code_cell("print('never runs')")],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, root / "planted.ipynb")
    lab = start_lab(root, tmp_path / "state")
    lesson = LessonPage(browser_context, lab, root / "planted.ipynb")
    try:
        lesson.open()
        fine, widget, error, never = lesson.run_all(timeout_s=backstop_s(["planted.ipynb"]))
    finally:
        lesson.close()
        lab.stop()
    assert (fine.count, fine.errors, fine.widgets) == (1, [], 0) and "fine" in fine.text
    assert (widget.count, widget.errors, widget.widgets) == (2, [], 1)
    assert error.count == 3 and len(error.errors) == 1 and "ValueError: planted error" in error.errors[0]
    assert never.count is None and never.errors == [] and "never runs" not in never.text
