"""Gradescope's results.json from the grader's results.

The format is Gradescope's "Autograder Specifications" (gradescope/autograder_samples,
docs/specs.md, last changed 2023-05-05, read at the repository's snapshot of 2025-01-15): a
`tests` list of `name`, `score`, `max_score`, `status`, `output`, `visibility`, and top-level
`output` and `execution_time`. Every text field is sent as plain text (`"text"` formats): reasons
and notes may quote what a submission chose, so nothing in them is rendered as HTML or Markdown.

The same page says that while tests are hidden, learners cannot see their total score. So no
results.json ever states a total (no top-level `score`), and for an exercise with hidden tests
the top-level `output` says only that it was graded, never its score: each visible test shows its
own points, and nothing adds the hidden ones up in sight of the learner.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mpcourse.grading.atomic import write_atomically
from mpcourse.grading.gradebook import SubmissionResult, clean

HIDDEN_CHOICES = ("after_published", "hidden", "after_due_date")  # what a test with hidden lines may be
MAX_OUTPUT_CHARS = 4000
NOT_SUBMITTED = "not submitted"


@dataclass(frozen=True)
class Expected:
    """An exercise this autograder grades: its tests, their points, and which hold hidden lines."""
    name: str
    tests: tuple[tuple[str, float], ...]
    hidden: frozenset[str] = frozenset()


def shown(text, limit: int = MAX_OUTPUT_CHARS) -> str:
    """`text` as Gradescope may show it: one line, no control characters, no lone surrogates, bounded."""
    text = clean(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def results_json(expected: list[Expected], graded: dict[str, SubmissionResult], hidden_visibility: str,
                 problems: list[str] = (), seconds: float = 0.0, waiting: dict[str,
                                                                               str] | None = None) -> dict:
    """results.json for one Gradescope submission.

    `graded` maps an exercise name to its result. An expected exercise without one scores 0, with
    the reason `waiting` gives for it ("grading did not finish", "the autograder could not
    start...") or "not submitted". Tests with hidden lines get `hidden_visibility`; the others are
    visible. The top level lists `problems` (files that could not be placed, re-uploads) and, per
    exercise, its score (only when it has no hidden tests), its error and the gradebook's notes.
    """
    if hidden_visibility not in HIDDEN_CHOICES:
        raise ValueError(f"hidden tests' visibility must be one of {', '.join(HIDDEN_CHOICES)}, "
                         f"got {hidden_visibility!r}")
    waiting = waiting or {}
    tests, lines = [], [shown(problem) for problem in problems]
    for number, exercise in enumerate(expected, 1):
        result = graded.get(exercise.name)
        by_id = {t.id: t for t in result.tests} if result else {}
        why_missing = ((result.error if result and result.error else None)
                       or waiting.get(exercise.name, NOT_SUBMITTED))
        for index, (test_id, points) in enumerate(exercise.tests, 1):
            got = by_id.get(test_id)
            passed = bool(got and got.passed)
            reason = "" if passed else (got.reason if got and got.reason else why_missing)
            tests.append({"name": f"{exercise.name}: {test_id}", "number": f"{number}.{index}",
                          "score": float(got.points) if got else 0.0, "max_score": float(points),
                          "status": "passed" if passed else "failed", "output": shown(reason),
                          "visibility": hidden_visibility if test_id in exercise.hidden else "visible"})
        if result is None:
            expected = (f" (expected a notebook named {exercise.name}.ipynb)"
                        if why_missing == NOT_SUBMITTED else "")
            lines.append(f"{exercise.name}: {shown(why_missing, 300)}{expected}")
            continue
        total = sum(points for _, points in exercise.tests)
        lines.append(f"{exercise.name}: graded; its total is not shown while some of its tests are hidden"
                     if exercise.hidden else f"{exercise.name}: {result.score:g}/{total:g}")
        notes = ([result.error] if result.error else []) + list(result.notes)
        lines.extend(f"  {shown(note, 500)}" for note in notes)
    return {"output": "\n".join(lines), "output_format": "text", "test_output_format": "text",
            "test_name_format": "text", "stdout_visibility": "hidden", "execution_time": round(seconds),
            "tests": tests}


def write_results(results: dict, path: str | Path) -> None:
    """Write results.json in one step (a reader sees the old file or the whole new one), readable
    by its owner alone: in Gradescope's container that is root, not the learner's code."""
    write_atomically(path, json.dumps(results, indent=1), mode=0o600)
