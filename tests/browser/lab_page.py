"""A notebook open in JupyterLab, seen and driven the way a learner does: menus, clicks, the page.

Everything here reads the rendered page (prompts, output areas, widget views), never the file.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

STDERR_MIME = "application/vnd.jupyter.stderr"   # how JupyterLab marks tracebacks and stderr

#: Reads the notebook's state in one round trip: each code cell's prompt, the text of every
#: error or stderr output, how many outputs show a widget view, and the start of its outputs' text.
_STATE_JS = """() => {
  const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')];
  return cells.map((cell, index) => ({
    index,
    prompt: (cell.querySelector('.jp-InputArea-prompt') || {}).textContent || '',
    errors: [...cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="%s"]')]
              .map(e => e.textContent.slice(0, 3000)),
    widgets: [...cell.querySelectorAll('.jp-OutputArea-output')]
              .filter(e => e.querySelector('.jupyter-widgets')).length,
    text: [...cell.querySelectorAll('.jp-OutputArea-output')].map(e => e.textContent).join('\\n').slice(0, 500),
  }));
}""" % STDERR_MIME


@dataclass
class CellState:
    index: int          # position among the notebook's code cells
    prompt: str         # "[3]:", "[*]:" while queued or running, "[ ]:" when not run
    errors: list[str]
    widgets: int        # outputs that show a rendered widget view
    text: str

    @property
    def count(self) -> int | None:
        digits = self.prompt.strip().strip("[]:")
        return int(digits) if digits.isdigit() else None


class LessonPage:
    """One notebook (a lesson or an exercise) open in its own browser tab; `path` is the notebook
    under the server's root."""

    def __init__(self, context, lab, path: Path):
        self.lab, self.notebook = lab, path.relative_to(lab.root).as_posix()
        cells = nbformat.read(path, as_version=4).cells
        code = [c for c in cells if c.cell_type == "code"]
        self.n_cells, self.n_code = len(cells), len(code)
        self.code_cells = [i for i, c in enumerate(code) if c.source.strip()]  # JupyterLab skips empty ones
        self.page = context.new_page()

    def open(self, timeout_s: float = 120) -> None:
        self.page.goto(self.lab.lab_url(self.notebook))
        self.page.wait_for_function(  # JupyterLab attaches a long notebook's cells in batches
            "n => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell').length >= n",
            arg=self.n_code, timeout=timeout_s * 1000)
        self.wait_for_kernel_idle(timeout_s)
        # Fold the file browser away: the notebook gets the whole width in the screenshots.
        self.page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()

    def wait_for_kernel_idle(self, timeout_s: float) -> None:
        self.page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for(timeout=timeout_s * 1000)

    def menu(self, menu: str, command: str) -> None:
        """Click `menu` in the menu bar, then the item that runs JupyterLab's `command`."""
        self.page.locator(".lm-MenuBar-item", has_text=menu).click()
        self.page.locator(f'.lm-Menu-item[data-command="{command}"]').click()

    def code(self) -> list[CellState]:
        """The state of the code cells that have source, as the page shows them now."""
        cells = self.page.evaluate(_STATE_JS)
        assert len(cells) == self.n_code, \
            f"{self.notebook}: the page shows {len(cells)} code cells, the file has {self.n_code}"
        return [CellState(**cells[i]) for i in self.code_cells]

    def run_all(self, timeout_s: float) -> list[CellState]:
        """Clear the stored outputs, Run > Run All Cells, and wait until every cell has run.

        Returns the cells' final state. Stops early when an error shows and nothing is running
        any more (JupyterLab stops a Run All at the first exception).
        """
        self.menu("Edit", "editmenu:clear-all")
        code = self.code()
        assert len(code) == len(self.code_cells) and all(c.count is None for c in code), \
            f"{self.notebook}: Clear Outputs of All Cells left prompts {[c.prompt for c in code]}"
        self.menu("Run", "runmenu:run-all")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.25)
            cells = self.code()
            running = any("*" in c.prompt for c in cells)
            if all(c.count is not None for c in cells) and not running:
                return cells
            if any(c.errors for c in cells) and not running:
                return cells
        raise AssertionError(f"{self.notebook}: Run All did not finish within {timeout_s} s; prompts "
                             f"{[c.prompt for c in self.code()]}")

    def cell(self, index: int):
        """Cell `index`, counted among all the notebook's cells (markdown too)."""
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(index)

    def replace_code(self, index: int, source: str) -> None:
        """Select all of code cell `index` and put `source` in its place, as a learner pasting it
        (inserted as text, so the editor adds no indentation or closing brackets of its own)."""
        self.cell(index).locator(".cm-content").click()
        self.page.keyboard.press("Control+A")
        self.page.keyboard.insert_text(source)

    def run_cell(self, index: int, timeout_s: float = 120) -> None:
        """Shift+Enter in cell `index`; wait until its prompt shows a new execution count."""
        prompt = self.cell(index).locator(".jp-InputArea-prompt")
        before = prompt.text_content()
        self.cell(index).locator(".cm-content").click()
        self.page.keyboard.press("Shift+Enter")
        self.page.wait_for_function(
            r"""([element, before]) => /\[\d+\]/.test(element.textContent) && element.textContent !== before""",
            arg=[prompt.element_handle(), before], timeout=timeout_s * 1000)

    def output_of(self, selector: str):
        """The output area (one cell's output) that contains `selector`."""
        outputs = self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output").filter(
            has=self.page.locator(selector))
        assert outputs.count() >= 1, f"{self.notebook}: no output shows {selector!r}"
        return outputs.first

    def screenshot(self, path: Path, element=None) -> Path:
        """The page, or one element. Cells above an element are painted as they scroll into view
        (content-visibility), which moves it: scroll until its position stops changing."""
        if element is not None:
            box = None
            for _ in range(20):
                element.evaluate("e => e.scrollIntoView({block: 'center'})")
                self.page.wait_for_timeout(100)
                if box == (box := element.bounding_box()):
                    break
        (element or self.page).screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.page.close()
        self.lab.shut_down_kernels()
