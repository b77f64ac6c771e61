"""`mpcourse grade --csv FILE --lms canvas|moodle`: a gradebook an LMS imports, beside the per-test CSV.

One row per learner and one column per exercise, holding the exercise's score (blank where the
learner handed nothing in, which both systems read as "no change"). The learner is the folder
holding the submission (`submissions/<learner>/ex00_bytes.ipynb`): name those folders by the
LMS's login id.

- Canvas (Gradebook > Import): identity columns Student, ID, SIS User ID, SIS Login ID, Section,
  then one column per assignment (as Canvas's gradebook import documentation describes them,
  in the summary of the Ohio State University's CarmenCanvas guide "Import a CSV file to Carmen
  grades"; Canvas matches a row by ID, SIS User ID or SIS Login ID). The learner's folder goes in
  Student and SIS Login ID; ID, SIS User ID and Section are left blank.
- Moodle (Grades > Import > CSV file): a Username column to map to the user's username, then one
  column per grade item; the columns are mapped by hand on import.

It reads the per-test gradebook the grader has just written (by column name), so it depends on
nothing but that file.
"""
from __future__ import annotations

import csv
import os
import tempfile
from pathlib import Path

from mpcourse.grading.gradebook import FORMULA_START, spreadsheet_cell

LMS = ("canvas", "moodle")
CANVAS_IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")


def learner_of(path: str) -> str:
    """The learner a submission belongs to: the folder that holds it."""
    return Path(path).parent.name or Path(path).stem


def _unescaped(cell: str) -> str:
    """A gradebook cell as written before `spreadsheet_cell` escaped it."""
    return cell[1:] if cell.startswith("'") and cell[1:].startswith(FORMULA_START) else cell


def scores_by_learner(gradebook: str | Path) -> tuple[list[str], dict[str, dict[str, float]]]:
    """The exercises (sorted) and each learner's score per exercise, from the per-test gradebook."""
    exercises, learners, seen = set(), {}, {}
    with open(gradebook, newline="") as f:
        for row in csv.DictReader(f):
            path, exercise = _unescaped(row["path"]), _unescaped(row["exercise"])
            if not exercise:
                continue  # a file the grader could not tie to an exercise
            learner = learner_of(path)
            first = seen.setdefault((learner, exercise), path)
            if first != path:
                raise ValueError(f"learner {learner!r} handed in {exercise} twice ({first} and {path}); the "
                                 "LMS gradebook needs one submission per learner and exercise")
            exercises.add(exercise)
            learners.setdefault(learner, {})[exercise] = float(row["score"])
    return sorted(exercises), learners


def lms_rows(lms: str, gradebook: str | Path) -> list[list[str]]:
    """The rows of the LMS import, header first."""
    if lms not in LMS:
        raise ValueError(f"--lms must be one of {', '.join(LMS)}, got {lms!r}")
    exercises, learners = scores_by_learner(gradebook)
    header = (list(CANVAS_IDENTITY) if lms == "canvas" else ["Username"]) + exercises
    rows = [header]
    for learner in sorted(learners):
        identity = [learner, "", "", learner, ""] if lms == "canvas" else [learner]
        scores = [f"{learners[learner][e]:g}" if e in learners[learner] else "" for e in exercises]
        rows.append([spreadsheet_cell(cell) for cell in identity] + scores)
    return rows


def lms_path(gradebook: str | Path, lms: str) -> Path:
    """Where the LMS gradebook goes: beside the per-test one, `gradebook.csv` -> `gradebook.canvas.csv`."""
    gradebook = Path(gradebook)
    return gradebook.with_name(f"{gradebook.stem}.{lms}.csv")


def write_lms_gradebook(lms: str, gradebook: str | Path) -> Path:
    """Write the LMS import beside `gradebook` in one step; returns its path."""
    rows, path = lms_rows(lms, gradebook), lms_path(gradebook, lms)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(rows)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
