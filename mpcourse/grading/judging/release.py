"""`mpcourse release`: write the learner's copy of every exercise from its solution.

The learner's notebook is generated, never edited by hand, so it cannot drift from the
solution: solution regions become a stub that raises, hidden tests disappear, outputs go. Beside
it, release writes what `check()` runs into the package (`checkable`: the visible tests, so that
`check()` works where the notebook's file is not in the working folder, as in Colab and Kaggle),
and names the exercise and that data's fingerprint in the check() cell.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from mpcourse.grading.judging.checkable import RELEASE_FOLDER, check_metadata, from_notebook
from mpcourse.grading.judging.exercise import (BEGIN_SOLUTION, END_SOLUTION, check_line, find_solutions,
                                                is_check_cell, is_test_cell, replace_regions, visible)

STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")


def release_notebook(solution: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The learner's version of a solution notebook named `name` (e.g. "ex00_bytes")."""
    nb = nbformat.from_dict(solution)  # a deep copy
    found = check_metadata(nb)
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index}"
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        if is_test_cell(cell):
            cell.source = visible(cell.source, where)
        else:
            cell.source = replace_regions(cell.source, BEGIN_SOLUTION, END_SOLUTION,
                                          lambda indent: [indent + line for line in STUB], where=where)
        cell.outputs = []
        cell.execution_count = None
    asked = solution.metadata.get("mpcourse", {}).get("write_yourself")
    nb.metadata["mpcourse"] = {"exercise": name, **found,
                               **({"write_yourself": list(asked)} if asked else {})}
    fingerprint = from_notebook(nb, name).fingerprint  # the check() cell is no setup: it does not count
    for cell in nb.cells:
        if is_check_cell(cell):
            cell.source = check_line(name, fingerprint)
    return nb


def release_all(solutions: str | Path = "solutions", exercises: str | Path = "exercises",
                visible_tests: str | Path | None = None) -> list[Path]:
    """Regenerate `exercises/` from `solutions/`, and the visible tests the package ships for
    `check()` (`visible_tests/<exercise>.json`; by default into the package of the course whose
    `solutions` they are, beside that folder); return the files written."""
    sources = find_solutions(solutions)
    if not sources:
        raise ValueError(f"no solution notebooks (ex*.ipynb) found in {solutions!r}")
    out_dir, data_dir = (Path(exercises),
                         Path(visible_tests or Path(solutions).resolve().parent / RELEASE_FOLDER))
    if not data_dir.parent.is_dir():
        raise ValueError(f"{data_dir.parent} is not the course's package that check()'s visible tests "
                         "ship in: release from a course checkout's solutions/, or pass "
                         "--visible-tests FOLDER")
    out_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sources.values():
        nb = release_notebook(nbformat.read(path, as_version=4), path.stem)
        target, data = out_dir / path.name, data_dir / f"{path.stem}.json"
        target.write_text(nbformat.writes(nb) + "\n")
        data.write_text(from_notebook(nb, path.stem).to_json())
        written += [target, data]
    return written
