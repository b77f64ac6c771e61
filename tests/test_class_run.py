"""A whole class, end to end: a Canvas bulk download -> collect -> grade -> report -> feedback.

30 learners hand in three exercises (ex00, ex01, ex05), built from the released exercises with
answers of four kinds: right (the solution's code), wrong (partly right, with a known set of
passing tests), crashing (the process dies, every other answer cell raises) and looping (a cell
that never ends). The class is laid out as Canvas's "Download Submissions" zip names its files
(canvas-lms `lib/content_zipper.rb`), with a late re-upload, a stale first upload and a file that
is not a notebook. The commands run as an instructor types them; the test then checks every
score against the one its answer was built to earn, the feedback pages for hidden text, the
report's pass rates against the gradebook, and the Canvas import's columns.
"""
import csv
import functools
import html
import json
import re
import subprocess
import time
import zipfile
from collections import Counter
from pathlib import Path

import nbformat
import pytest
from cached_plans import MPCOURSE
from grading_budgets import backstop, program_backstop

from mpcourse.grading.judging.exercise import (BEGIN_HIDDEN, BEGIN_SOLUTION, END_HIDDEN, END_SOLUTION,
                                                load_exercise)

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ("ex00_bytes", "ex01_bf16_rounding", "ex05_scaler_update")
LEARNERS = 30
TIMEOUT = 30  # --timeout: CPU seconds, so honest work (a few seconds) keeps its score on a busy machine,
# and each looping answer costs this much CPU time
# The tests a "wrong" answer was built to pass (every other test fails).
WRONG_PASSES = {"ex00_bytes": {"fp32_ten_million"},
                "ex01_bf16_rounding": {"predict_count_1024_2048", "predict_rounded_value", "predict_largest_error"},
                "ex05_scaler_update": set()}
WRONG_ANSWERS = {"ex00_bytes": {"def tensor_bytes": "def tensor_bytes(numel, dtype):\n    return numel * 4\n"},
                 "ex05_scaler_update": {"def update_scale": "def update_scale(scale, growth_tracker, found_inf, "
                                        "growth_factor, backoff_factor, growth_interval):\n"
                                        "    return scale, growth_tracker\n"}}


@functools.cache
def loaded(name: str):
    """The exercise `name` as the grader loads it from its solution (when a test first asks)."""
    return load_exercise(ROOT / "solutions" / f"{name}.ipynb")


def kind_of(learner: int, exercise: int) -> str:
    """The answer learner `learner` hands in for exercise `exercise`: two loop, the rest mixed."""
    if (learner, exercise) in ((7, 0), (19, 2)):
        return "looping"
    return ("right", "right", "wrong", "crashing", "right", "wrong")[(learner + 2 * exercise) % 6]


def _answer_cells(name: str) -> dict[int, str]:
    """Index -> the solution's code (markers removed) for each cell the learner must write."""
    solution = nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    found = {}
    for index, cell in enumerate(solution.cells):
        if cell.cell_type == "code" and BEGIN_SOLUTION in cell.source:
            found[index] = "\n".join(line for line in cell.source.splitlines()
                                     if line.strip() not in (BEGIN_SOLUTION, END_SOLUTION))
    return found


def notebook(name: str, kind: str) -> bytes:
    """The released exercise with its answer cells written as `kind` asks."""
    nb = nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4)
    answers = _answer_cells(name)
    for position, (index, code) in enumerate(sorted(answers.items())):
        assert "NotImplementedError" in nb.cells[index].source, (name, index)  # same layout as the solution
        if kind == "right":
            nb.cells[index].source = code
        elif kind == "wrong":
            wrong = next((text for start, text in WRONG_ANSWERS.get(name, {}).items() if start in code), None)
            right_here = name == "ex01_bf16_rounding" and "PREDICTION_" in code
            nb.cells[index].source = code if right_here else wrong or nb.cells[index].source
        elif kind == "crashing":
            nb.cells[index].source = "import os\nos._exit(1)" if position == 0 else "raise RuntimeError('crashed')"
        elif kind == "looping":
            nb.cells[index].source = "while True:\n    pass" if position == 0 else code
    return nbformat.writes(nb).encode()


def expected_score(name: str, kind: str) -> float:
    tests = loaded(name).tests
    if kind == "right":
        return sum(t.points for t in tests)
    if kind == "wrong":
        return sum(t.points for t in tests if t.id in WRONG_PASSES[name])
    return 0.0


def canvas_download(folder: Path) -> tuple[Path, dict]:
    """The class as Canvas's bulk download names it; returns the zip and (user id, exercise) -> kind."""
    expected, entries, attachment = {}, [], 5000
    for learner in range(LEARNERS):
        user_id, sortable = str(1000 + learner), f"learner{chr(97 + learner % 26)}{chr(97 + learner // 26)}"
        for number, name in enumerate(EXERCISES):
            if learner == 29 and name == "ex05_scaler_update":
                continue  # handed nothing in
            kind = kind_of(learner, number)
            expected[user_id, name] = kind
            attachment += 1
            late = "_LATE" if learner == 3 and number == 0 else ""
            if late:  # a first, wrong upload, then a late right one that Canvas renamed ex00_bytes-1
                entries.append((f"{sortable}_{user_id}_{attachment}_{name}.ipynb", notebook(name, "wrong"),
                                (2026, 3, 1, 10, 0, 0)))
                attachment += 1
                entries.append((f"{sortable}{late}_{user_id}_{attachment}_{name}-1.ipynb", notebook(name, "right"),
                                (2026, 3, 2, 9, 30, 0)))
                expected[user_id, name] = "right"
            else:
                entries.append((f"{sortable}_{user_id}_{attachment}_{name}.ipynb", notebook(name, kind),
                                (2026, 3, 1, 12, 0, 0)))
    entries.append(("learnerba_1001_9999_my_notes.pdf", b"%PDF-1.4", (2026, 3, 1, 12, 0, 0)))
    download = folder / "course-ex submissions.zip"
    with zipfile.ZipFile(download, "w") as zf:
        for member, data, when in entries:
            zf.writestr(zipfile.ZipInfo(member, date_time=when), data)
    return download, expected


def _cli(*args, cwd, timeout=None):
    return subprocess.run([*MPCOURSE, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout or program_backstop())


@pytest.fixture(scope="module")
def class_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    download, expected = canvas_download(folder)
    start = time.monotonic()
    collected = _cli("collect", "--from", "canvas", str(download), "--out", "submissions", cwd=folder)
    assert collected.returncode == 0, collected.stderr
    paths = sorted(str(p.relative_to(folder)) for p in (folder / "submissions").glob("*/*.ipynb"))
    graded = _cli("grade", "--csv", "gradebook.csv", "--lms", "canvas", "--jsonl", "--jobs", "2",
                  "--timeout", str(TIMEOUT), "--", *paths, cwd=folder, timeout=backstop(paths, TIMEOUT, jobs=2))
    assert graded.returncode == 0, graded.stderr[-3000:]
    reported = _cli("report", "gradebook.csv", "--out", "report.html", cwd=folder)
    assert reported.returncode == 0, reported.stderr
    fed = _cli("feedback", "gradebook.csv", "--out", "feedback", cwd=folder)
    assert fed.returncode == 0, fed.stderr
    lines = [json.loads(line) for line in graded.stdout.splitlines()]
    print(f"\nclass run: {len(paths)} notebooks collected, graded, reported and fed back in "
          f"{time.monotonic() - start:.0f} s; slowest {max(r['seconds'] for r in lines):.1f} s")
    return folder, expected, collected, lines


def test_collect_places_every_notebook_and_reports_the_rest(class_run):
    folder, expected, collected, _ = class_run
    placed = {(p.parent.name, p.stem) for p in (folder / "submissions").glob("*/*.ipynb")}
    assert placed == set(expected)
    assert "1003: 2 uploads of ex00_bytes: kept the newest, 'ex00_bytes-1.ipynb' (2026-03-02 09:30:00)" \
        in collected.stderr, collected.stderr
    assert "1003: ex00_bytes was handed in late" in collected.stderr
    assert "1001: cannot place 'my_notes.pdf': not a notebook" in collected.stderr
    roster = list(csv.DictReader((folder / "submissions" / "learners.csv").open()))
    assert {row["learner"]: row["name"] for row in roster}["1000"] == "learneraa"


def test_every_score_is_the_one_its_answer_earns(class_run):
    folder, expected, _, lines = class_run
    got = {(Path(r["path"]).parent.name, r["exercise"]): r for r in lines}
    assert set(got) == set(expected)
    wrong = {key: (r["score"], expected[key], r["error"]) for key, r in got.items()
             if r["score"] != expected_score(key[1], expected[key])}
    assert not wrong, wrong
    loops = [r for key, r in got.items() if expected[key] == "looping"]
    assert loops and all("timed out" in (r["error"] or "") for r in loops), loops
    assert all(r["seconds"] > 0 and r["cpu_seconds"] > 0 for r in lines)
    # a loop spends its whole budget inside its sandbox: CPU seconds count the sandbox's, not only the grader's
    assert all(r["cpu_seconds"] >= TIMEOUT for r in loops), [r["cpu_seconds"] for r in loops]


def _hidden_lines() -> set[str]:
    """Every non-trivial line between the hidden-test markers of the three solutions that the
    released exercise does not show elsewhere (a visible test may share a line with a hidden one)."""
    lines = set()
    for name in EXERCISES:
        inside = False
        for cell in nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4).cells:
            for line in cell.source.splitlines():
                inside = (line.strip() == BEGIN_HIDDEN) or (inside and line.strip() != END_HIDDEN)
                if inside and line.strip() != BEGIN_HIDDEN and len(line.strip()) >= 12:
                    lines.add(line.strip())
    shown = {line.strip() for name in EXERCISES
             for cell in nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4).cells
             for line in cell.source.splitlines()}
    assert len(lines - shown) >= 3
    return lines - shown


def test_every_learner_has_feedback_without_hidden_text(class_run):
    folder, expected, _, _ = class_run
    hidden = _hidden_lines()
    for user_id, name in expected:
        page = folder / "feedback" / user_id / f"{name}.html"
        text = html.unescape(page.read_text())
        assert f"{name}: " in text and "data-test=" in page.read_text()
        leaked = [line for line in hidden if line in text]
        assert not leaked, (page, leaked[:2])
        with zipfile.ZipFile(folder / "feedback" / f"{user_id}.zip") as zf:
            assert f"{name}.html" in zf.namelist()
            assert not any(line in html.unescape(zf.read(f"{name}.html").decode()) for line in hidden)


def test_the_reports_pass_rates_are_the_gradebooks(class_run):
    folder = class_run[0]
    passed, taken = Counter(), Counter()
    with open(folder / "gradebook.csv", newline="") as f:
        for row in csv.DictReader(f):
            taken[row["exercise"], row["test"]] += 1
            passed[row["exercise"], row["test"]] += row["passed"] == "True"
    page = (folder / "report.html").read_text()
    shown = {(html.unescape(e), html.unescape(t)): float(rate)
             for e, t, rate in re.findall(r'data-exercise="([^"]*)" data-test="([^"]*)" data-rate="([^"]*)"', page)}
    assert shown.keys() == taken.keys()
    assert all(abs(shown[key] - passed[key] / taken[key]) < 1e-6 for key in taken)
    rates = list(shown.values())
    assert rates == sorted(rates), "hardest first"
    assert page.count("<img") == 2 and "Learners who scored 0" in page


def test_the_canvas_import_has_canvas_columns(class_run):
    folder, expected, _, lines = class_run
    with open(folder / "gradebook.canvas.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *EXERCISES]
    assert rows[1] == ["    Points Possible", "", "", "", ""] + [f"{loaded(e).max_score:.2f}" for e in EXERCISES]
    by_id = {row[1]: row for row in rows[2:]}
    assert set(by_id) == {user_id for user_id, _ in expected}
    assert by_id["1029"][7] == ""  # nothing handed in: blank, which Canvas reads as no change
    scores = {(Path(r["path"]).parent.name, r["exercise"]): r["score"] for r in lines}
    for user_id, row in by_id.items():
        assert by_id[user_id][0].startswith("learner")
        for column, name in enumerate(EXERCISES, 5):
            if (user_id, name) in scores:
                assert float(row[column]) == scores[user_id, name]
