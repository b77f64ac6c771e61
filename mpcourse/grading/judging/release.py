"""`mpcourse release`: write the learner's copy of every exercise from its solution.

The learner's notebook is generated, never edited by hand, so it cannot drift from the
solution: solution regions become a stub that raises, hidden tests disappear, outputs go.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from mpcourse.grading.judging.exercise import (BEGIN_SOLUTION, END_SOLUTION, defined_names, find_solutions,
                                                has_solution, is_check_cell, is_test_cell, replace_regions,
                                                visible, without_markers)

STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")


def check_metadata(solution: nbformat.NotebookNode) -> dict:
    """What check() needs to build the tests' namespace as the grader does: the answers to ask
    the kernel for, and the cells (by id) that the tests' setup is made of."""
    answers = [n for c in solution.cells if has_solution(c) for n in defined_names(without_markers(
        c.source, BEGIN_SOLUTION, END_SOLUTION))]
    setup = [c.get("id") for c in solution.cells if c.cell_type == "code" and not is_test_cell(c)
             and not has_solution(c) and not is_check_cell(c)]
    return {"answers": list(dict.fromkeys(answers)), "setup": setup}


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
    nb.metadata["mpcourse"] = {"exercise": name, **found, **({"write_yourself": list(asked)} if asked else {})}
    return nb


def release_all(solutions: str | Path = "solutions", exercises: str | Path = "exercises") -> list[Path]:
    """Regenerate `exercises/` from `solutions/`; return the files written."""
    sources = find_solutions(solutions)
    if not sources:
        raise ValueError(f"no solution notebooks (ex*.ipynb) found in {solutions!r}")
    out_dir = Path(exercises)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sources.values():
        nb = release_notebook(nbformat.read(path, as_version=4), path.stem)
        target = out_dir / path.name
        target.write_text(nbformat.writes(nb) + "\n")
        written.append(target)
    return written
