"""Breaking a stored output in any notebook makes `make test` fail.

`make test` trusts nbval to compare every notebook's fresh outputs with the stored ones. This
checks that trust, notebook by notebook: copy the notebook, change the first stored output nbval
compares, drop the cells after it, and run nbval with the Makefile's own flags. The broken cell
must fail with nbval's "outputs differ" report, and every cell before it must pass, so the failure
comes from the broken output and from nothing else.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import find_comment_markers, find_metadata_tags

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
BROKEN = "\nthis line was not in the stored output\n"


def makefile_nbval_flags() -> list[str]:
    """The flags `make notebooks` passes to pytest (the Makefile's NBVAL variable)."""
    match = re.search(r"^NBVAL\s*:?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile no longer defines NBVAL"
    return [str(ROOT / flag) if flag.endswith(".cfg") else flag for flag in shlex.split(match.group(1))]


def nbval_checks(cell) -> bool:
    """Whether nbval compares this code cell's outputs, by nbval's own reading of tags and markers."""
    options = defaultdict(lambda: None, find_metadata_tags(cell.metadata))
    options.update(dict(find_comment_markers(cell.source)))
    return not options["skip"] and options["check"] is not False


def break_first_checked_output(nb) -> int:
    """Change the text of the first output nbval compares; return its code-cell number (nbval's 'Cell N')."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    for number, cell in enumerate(code):
        if not nbval_checks(cell):
            continue
        for out in cell.outputs:
            if out.output_type == "stream":
                out.text += BROKEN
            elif "text/plain" in out.get("data", {}):
                out.data["text/plain"] += BROKEN
            else:
                continue
            nb.cells = nb.cells[:nb.cells.index(cell) + 1]
            return number
    raise AssertionError("no stored text output that nbval compares")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_changed_stored_output_fails_nbval(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    cell = break_first_checked_output(nb)
    copy = tmp_path / path.name
    nbformat.write(nb, copy)
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *makefile_nbval_flags(),
                             str(copy)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    report = result.stdout + result.stderr
    assert result.returncode == 1, f"nbval did not fail on a changed output in {path.name}:\n{report[-3000:]}"
    failed = re.findall(r"^FAILED .*::Cell (\d+)", report, re.MULTILINE)
    assert failed == [str(cell)], f"expected exactly Cell {cell} to fail, got {failed}:\n{report[-3000:]}"
    assert "Cell outputs differ" in report and "this line was not in the stored output" in report, report[-3000:]
    passed = re.search(r"\b(\d+) passed\b", report)
    assert (int(passed.group(1)) if passed else 0) == cell, \
        f"the {cell} cells before the broken one must pass:\n{report[-3000:]}"
