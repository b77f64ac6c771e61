"""What `check()` runs for one exercise, read from its notebook or from the copy the package ships.

Colab and Kaggle do not put the learner's notebook in the kernel's working folder, so `check()`
cannot always read the test cells from the file. `mpcourse release` therefore writes, beside each
learner's copy, the exercise's *visible* tests, its setup cells and its answer names into the
package (`visible_tests/<exercise>.json`, package data). Both are made by `from_notebook` from the
released notebook, so the file and the package give `check()` the same tests. Hidden tests never
reach either: a released notebook has none.

The fingerprint is a digest of exactly what `check()` runs. Release writes it into the check
cell, `check("ex01_bf16_rounding", release="...")`, so a notebook released from another version
of the course than the installed package is told so instead of being checked against other tests.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from mpcourse.grading.judging.exercise import (BEGIN_SOLUTION, END_SOLUTION, EXERCISE_NAME, defined_names,
                                                has_code, has_solution, is_check_cell, is_test_cell, visible,
                                                without_markers)

#: Where the package keeps the shipped visible tests, and where `mpcourse release` writes them
#: (relative to the course's root, the folder that holds `solutions/`).
SHIPPED = Path(__file__).resolve().parents[1] / "visible_tests"
RELEASE_FOLDER = SHIPPED.relative_to(SHIPPED.parents[2])  # mpcourse/grading/visible_tests


@dataclass(frozen=True)
class VisibleTest:
    id: str
    points: float
    source: str  # as the learner's notebook shows it


@dataclass(frozen=True)
class Checkable:
    """One exercise as `check()` runs it: the answers to ask the kernel for, the setup cells
    that build the tests' namespace, the visible tests, and the points of the hidden ones."""
    exercise: str
    answers: tuple[str, ...]
    setup: tuple[str, ...]
    tests: tuple[VisibleTest, ...]
    hidden_points: float
    write_yourself: tuple[str, ...] = ()

    @property
    def fingerprint(self) -> str:
        """12 hex digits of the SHA-256 of everything above: equal fingerprints, equal checks."""
        return hashlib.sha256(_canonical(asdict(self)).encode()).hexdigest()[:12]

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "fingerprint": self.fingerprint}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Checkable:
        data = json.loads(text)
        stored = data.pop("fingerprint")
        found = cls(data["exercise"], tuple(data["answers"]), tuple(data["setup"]),
                    tuple(VisibleTest(**t) for t in data["tests"]), data["hidden_points"],
                    tuple(data["write_yourself"]))
        if found.fingerprint != stored:
            raise ValueError(f"the shipped tests of {found.exercise} are damaged "
                             f"(fingerprint {found.fingerprint}, stored {stored}): reinstall mpcourse")
        return found


def _canonical(data: dict) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def check_metadata(solution: nbformat.NotebookNode) -> dict:
    """What check() needs to build the tests' namespace as the grader does: the answers to ask
    the kernel for, and the cells (by id) that the tests' setup is made of."""
    answers = [n for c in solution.cells if has_solution(c) for n in defined_names(without_markers(
        c.source, BEGIN_SOLUTION, END_SOLUTION))]
    setup = [c.get("id") for c in solution.cells if c.cell_type == "code" and not is_test_cell(c)
             and not has_solution(c) and not is_check_cell(c)]
    return {"answers": list(dict.fromkeys(answers)), "setup": setup}


def from_notebook(nb: nbformat.NotebookNode, name: str) -> Checkable:
    """What `check()` runs for a released notebook (its metadata names answers and setup cells)
    or a solution (what release would write); `name` is the exercise (or file) it came from."""
    meta = nb.metadata.get("mpcourse", {})
    if ("answers" not in meta or "setup" not in meta) and any(has_solution(c) for c in nb.cells):
        meta = {**meta, **check_metadata(nb)}
    if "answers" not in meta or "setup" not in meta:
        raise ValueError(f"{name} lacks the metadata `mpcourse release` writes (its answers and setup "
                         "cells): take a fresh copy of the exercise")
    tests, hidden_points = [], 0.0
    for cell in nb.cells:
        if not is_test_cell(cell):
            continue
        grading = cell.metadata["nbgrader"]
        points, source = float(grading["points"]), visible(cell.source)
        if has_code(source):
            tests.append(VisibleTest(grading["grade_id"], points, source))
        else:
            hidden_points += points
    if not tests and not hidden_points:
        raise ValueError(f"{name} has no graded test cells, so there is nothing to check")
    setup_ids = set(meta["setup"])
    return Checkable(meta.get("exercise", name), tuple(meta["answers"]),
                     tuple(c.source for c in nb.cells if c.get("id") in setup_ids), tuple(tests),
                     hidden_points, tuple(meta.get("write_yourself", ())))


def known() -> list[str]:
    """The exercises whose visible tests this package ships."""
    return sorted(p.stem for p in SHIPPED.glob("ex*.json"))


def shipped(exercise: str, release: str | None = None) -> Checkable:
    """The package's copy of `exercise`; an unknown name, or a `release` fingerprint other than the
    package's, raises a ValueError that says which and how to bring the two together."""
    names = known()
    if not isinstance(exercise, str) or not EXERCISE_NAME.fullmatch(exercise):
        raise ValueError(f"check({exercise!r}): not an exercise of this course; pass one of "
                         f"{', '.join(names)}, or a notebook's path ending in .ipynb")
    if exercise not in names:
        raise ValueError(f"The installed mpcourse does not know exercise {exercise!r} "
                         f"(it knows {', '.join(names)}), so it is older than this notebook: "
                         f"{update_advice()}")
    found = Checkable.from_json((SHIPPED / f"{exercise}.json").read_text())
    if release is not None and release != found.fingerprint:
        raise ValueError(f"This notebook was released from another version of the course than the "
                         f"installed mpcourse (the tests of {exercise}: release {release!r} here, "
                         f"{found.fingerprint!r} in the package): {update_advice()}")
    return found


def update_advice() -> str:
    """How a learner brings the package and the notebook to the course's current version."""
    from importlib.metadata import PackageNotFoundError, metadata

    from mpcourse.hosted import Repository
    from mpcourse.hosted_session import hosted_platform
    try:
        urls = metadata("mpcourse").get_all("Project-URL") or []
    except PackageNotFoundError:
        urls = []
    url = next((u.split(",", 1)[1].strip() for u in urls if u.lower().startswith("repository,")), None)
    source = Repository(url).install_source if url else "mpcourse"
    platform = hosted_platform()
    restart = platform.restart_steps if platform else "Kernel -> Restart Kernel"
    return (f"update the package with `%pip install --force-reinstall --no-deps \"{source}\"`, restart the "
            f"kernel ({restart}) and run the notebook from the top (or, if the course changed since you "
            "opened this notebook, open its current copy and move your answers there)")
