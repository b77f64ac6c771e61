"""LMS gradebook imports from the per-test gradebook: Canvas, Moodle and Blackboard.

One row per learner and one column per exercise, holding the exercise's score (blank where the
learner handed nothing in, which each system reads as "no change"). The learner is the folder
holding the submission (`submissions/<learner>/ex00_bytes.ipynb`, as `mpcourse collect` lays
it out). Where `mpcourse collect` left a `learners.csv` beside those folders, each learner's
name and LMS id come from it.

- Canvas (Grades > Import). The columns are the ones Canvas's own export writes
  (canvas-lms `lib/gradebook_exporter.rb`, read at commit 0140a2ef, 2025): Student, ID,
  SIS User ID, SIS Login ID, Section, then one column per assignment, and a second row whose
  Student cell is "    Points Possible" holding each assignment's points. Canvas matches a row by
  ID (the Canvas user id, which a Canvas bulk download names), SIS User ID or SIS Login ID. An
  assignment header without Canvas's " (id)" suffix makes Canvas create a new assignment; name
  an existing one with `assignment_ids` ({"ex00_bytes": "1234"} gives "ex00_bytes (1234)").
- Moodle (Grades > Import > CSV file; Moodle 4.x `grade/import/csv`): a Username column to map
  to the user's username, then one column per grade item; the columns are mapped on import.
- Blackboard Learn Original (Grade Center > Work Offline > Upload): Username, then a column per
  exercise headed "<name> [Total Pts: <points> Score]" as the Grade Center's download heads
  them. Not tried on a Blackboard server here.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from mpcourse.grading.atomic import write_atomically
from mpcourse.grading.gradebook import read_gradebook, spreadsheet_cell

LMS = ("canvas", "moodle", "blackboard")
CANVAS_IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
CANVAS_POINTS_POSSIBLE = "    Points Possible"  # exactly as Canvas's export writes it
LEARNERS_FILE = "learners.csv"  # written by `mpcourse collect`: learner, name, lms_id


def learner_of(path: str) -> str:
    """The learner a submission belongs to: the folder that holds it."""
    return Path(path).parent.name or Path(path).stem


def roster_of(paths) -> dict[str, dict[str, str]]:
    """learner -> {name, lms_id}, from the learners.csv files beside the learners' folders."""
    roster = {}
    for folder in {Path(p).parent.parent for p in paths}:
        if (folder / LEARNERS_FILE).is_file():
            with open(folder / LEARNERS_FILE, newline="", encoding="utf-8") as f:
                roster.update({row["learner"]: row for row in csv.DictReader(f)})
    return roster


def scores_by_learner(gradebook: str | Path):
    """The exercises (sorted), their maximum scores, each learner's score per exercise, and the roster."""
    maxima, learners, seen = {}, {}, {}
    results = read_gradebook(gradebook)
    for result in results:
        if not result.exercise:
            continue  # a file the grader could not tie to an exercise
        learner = learner_of(result.path)
        first = seen.setdefault((learner, result.exercise), result.path)
        if first != result.path:
            raise ValueError(f"learner {learner!r} handed in {result.exercise} twice ({first} and "
                             f"{result.path}); "
                             "the LMS gradebook needs one submission per learner and exercise")
        maxima[result.exercise] = result.max_score
        learners.setdefault(learner, {})[result.exercise] = result.score
    return sorted(maxima), maxima, learners, roster_of(r.path for r in results)


def lms_rows(lms: str, gradebook: str | Path, assignment_ids: dict[str,
                                                                   str] | None = None) -> list[list[str]]:
    """The rows of the LMS import, header first."""
    if lms not in LMS:
        raise ValueError(f"--lms must be among {', '.join(LMS)}, got {lms!r}")
    exercises, maxima, learners, roster = scores_by_learner(gradebook)
    ids = assignment_ids or {}
    if lms == "canvas":
        header = list(CANVAS_IDENTITY) + [f"{e} ({ids[e]})" if e in ids else e for e in exercises]
        rows = [header, [CANVAS_POINTS_POSSIBLE, "", "", "", ""] + [f"{maxima[e]:.2f}" for e in exercises]]
    elif lms == "moodle":
        rows = [["Username"] + exercises]
    else:
        rows = [["Username"] + [f"{e} [Total Pts: {maxima[e]:g} Score]" for e in exercises]]
    for learner in sorted(learners):
        known = roster.get(learner, {})
        if lms == "canvas":
            canvas_id = known.get("lms_id") or (learner if learner.isdigit() else "")
            identity = [known.get("name") or learner, canvas_id, "", "" if canvas_id else learner, ""]
        else:
            identity = [learner]
        scores = [f"{learners[learner][e]:g}" if e in learners[learner] else "" for e in exercises]
        rows.append([spreadsheet_cell(cell) for cell in identity] + scores)
    return rows


def lms_path(gradebook: str | Path, lms: str) -> Path:
    """Where the LMS gradebook goes: beside the per-test one, `gradebook.csv` -> `gradebook.canvas.csv`."""
    gradebook = Path(gradebook)
    return gradebook.with_name(f"{gradebook.stem}.{lms}.csv")


def write_lms_gradebook(lms: str, gradebook: str | Path, out: str | Path | None = None,
                        assignment_ids: dict[str, str] | None = None) -> Path:
    """Write the LMS import (beside `gradebook` unless `out` is given) in one step; returns its path."""
    rows = lms_rows(lms, gradebook, assignment_ids)
    text = io.StringIO(newline="")
    csv.writer(text).writerows(rows)
    return write_atomically(out or lms_path(gradebook, lms), text.getvalue())


def parse_systems(values) -> list[str]:
    """`--lms canvas,moodle` or `--lms canvas --lms moodle` as a list, each one checked."""
    systems = [s.strip() for value in values or () for s in str(value).split(",") if s.strip()]
    for system in systems:
        if system not in LMS:
            raise ValueError(f"--lms must be among {', '.join(LMS)}, got {system!r}")
    return list(dict.fromkeys(systems))
