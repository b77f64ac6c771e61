"""Breaking a stored output in any notebook makes `make test` fail.

`make test` trusts nbval to compare every notebook's fresh outputs with the stored ones. This
checks that trust: every lesson and solution stores an output that nbval compares (read with
nbval's own tag and marker parsing), and nbval, run with the Makefile's own flags, fails on a
changed one. For that, two copies (a lesson and a solution, each the one whose first compared
output comes soonest) get that output changed and the cells after it dropped, and run under nbval
in one pytest run: in each the broken cell must fail with nbval's "outputs differ" report and
every cell before it must pass, so the failure comes from the broken output and nothing else.
What nbval does with a changed output depends on its flags and the sanitizing rules, which are
the same for every notebook, so two copies prove it for all, without running every notebook.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import find_comment_markers, find_metadata_tags

from notebook_times import backstop_s

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
BROKEN = "this line was not in the stored output"


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


def break_first_checked_output(nb) -> int | None:
    """Change the text of the first output nbval compares and drop the cells after it.

    Returns the cell's number among code cells, which is nbval's "Cell N"; None when the
    notebook stores no text output that nbval compares.
    """
    code = [c for c in nb.cells if c.cell_type == "code"]
    for number, cell in enumerate(code):
        if not nbval_checks(cell):
            continue
        for out in cell.outputs:
            if out.output_type == "stream":
                out.text += f"\n{BROKEN}\n"
            elif "text/plain" in out.get("data", {}):
                out.data["text/plain"] += f"\n{BROKEN}"
            else:
                continue
            nb.cells = nb.cells[:nb.cells.index(cell) + 1]
            return number
    return None


def broken_copies() -> dict[Path, tuple[int, object]]:
    """The two notebooks to break: for the lessons and the solutions, the one whose first compared
    output comes soonest (the fewest cells to run), with its broken cell's number and broken copy."""
    chosen = {}
    for folder in ("notebooks", "solutions"):
        candidates = []
        for path in (p for p in NOTEBOOKS if p.parent.name == folder):
            nb = nbformat.read(path, as_version=4)
            cell = break_first_checked_output(nb)
            if cell is not None:
                candidates.append((cell, path.name, path, nb))
        cell, _, path, nb = min(candidates, key=lambda candidate: candidate[:2])
        chosen[path] = (cell, nb)
    return chosen


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_notebook_stores_an_output_nbval_compares(path):
    assert break_first_checked_output(nbformat.read(path, as_version=4)) is not None, (
        f"{path.name} stores no output that nbval compares, so make test checks none of it: "
        "execute it and save it with its outputs")


@pytest.fixture(scope="module")
def nbval_on_broken_copies(tmp_path_factory):
    """Run nbval once over the broken copies.

    Returns {copy: (broken cell, {cell name: "passed" | failure message})} and the run's output.
    """
    root = tmp_path_factory.mktemp("broken")
    broken = {}
    for path, (cell, nb) in broken_copies().items():
        copy = f"{path.parent.name}/{path.name}"
        broken[copy] = cell
        (root / path.parent.name).mkdir(exist_ok=True)
        nbformat.write(nb, root / copy)
    report = root / "report.xml"
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(root),
                             f"--junitxml={report}", *makefile_nbval_flags(), *broken],
                            cwd=root, capture_output=True, text=True, timeout=backstop_s(broken))
    outcomes: dict[str, dict[str, str]] = defaultdict(dict)
    for case in ET.parse(report).iter("testcase"):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        outcomes[case.get("classname")][case.get("name")] = \
            "passed" if problem is None else problem.get("message", "") + (problem.text or "")
    # junit names a test's file with dots for slashes: notebooks.00_welcome.ipynb
    return {copy: (cell, outcomes[copy.replace("/", ".")]) for copy, cell in broken.items()}, result


@pytest.mark.parametrize("folder", ["notebooks", "solutions"])
def test_a_changed_stored_output_fails_nbval(folder, nbval_on_broken_copies):
    by_copy, result = nbval_on_broken_copies
    ((copy, (cell, outcomes)),) = [(c, found) for c, found in by_copy.items() if c.startswith(folder + "/")]
    assert result.returncode == 1, f"nbval did not fail on the broken copies:\n{result.stdout[-3000:]}"
    expected = {f"Cell {i}" for i in range(cell + 1)}
    assert set(outcomes) == expected, f"nbval ran cells {sorted(outcomes)}, expected {sorted(expected)}"
    failure = outcomes[f"Cell {cell}"]
    assert failure != "passed", f"{copy}: nbval passed Cell {cell} although its stored output was changed"
    assert "Cell outputs differ" in failure and BROKEN in failure, f"{copy}, Cell {cell}: {failure[-2000:]}"
    before = {name: outcome[-500:] for name, outcome in outcomes.items()
              if name != f"Cell {cell}" and outcome != "passed"}
    assert not before, f"{copy}: cells before the broken one failed too: {before}"
