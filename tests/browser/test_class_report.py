"""The class report (`mpcourse report`) opened in headless Chromium: it loads without a console
error, every picture decodes, the four sections are there, the tests table is hardest first and
agrees with the gradebook, and a screenshot is kept in artifacts/browser/ for a person to look at.

The gradebook is a generated class of 36 learners: right, partly right, crashing and looping
answers, as the grader reports them, written with the grader's own `write_gradebook`.
"""
from __future__ import annotations

import csv
import random
import subprocess
import sys
from pathlib import Path

import pytest

from mpcourse.grading.gradebook import SubmissionResult, write_gradebook
from mpcourse.grading.grader import Options
from mpcourse.grading.sandbox.limits import WALL_FACTOR
from mpcourse.grading.judging.selfcheck import TestResult as Verdict

EXERCISES = {"ex00_bytes": ["fp32_ten_million", "fp16_ten_million", "bf16_matches_torch", "any_size_matches_torch"],
             "ex05_scaler_update": ["backoff_on_overflow", "count_clean_iterations", "growth_at_interval",
                                    "no_growth_to_inf", "fp32_rounding"]}


def generated_class(learners: int = 36) -> list[SubmissionResult]:
    rng, results = random.Random(0), []
    for number in range(learners):
        for exercise, tests in EXERCISES.items():
            kind = rng.choice(["right", "right", "partial", "crash", "loop"])
            error = {"crash": "a code cell raised RuntimeError: crashed",
                     "loop": "timed out: the submission ran longer than 30 s (an endless loop?)"}.get(kind)
            verdicts = [Verdict(t, 1.0, 1.0, True, None) if kind == "right" or (kind == "partial" and i < 2)
                        else Verdict(t, 0.0, 1.0, False, error or f"{t}: expected 20000000, got 40000000")
                        for i, t in enumerate(tests)]
            seconds = 30.0 + rng.random() if kind == "loop" else 2 + 3 * rng.random()
            results.append(SubmissionResult(f"submissions/learner{number:02d}/{exercise}.ipynb", exercise,
                                            sum(v.points for v in verdicts), float(len(tests)), error, verdicts,
                                            seconds, cpu_seconds=seconds * 0.9))
    return results


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("report")
    write_gradebook(generated_class(), folder / "gradebook.csv")
    done = subprocess.run([sys.executable, "-m", "mpcourse.cli", "report", "gradebook.csv", "--out", "report.html"],
                          capture_output=True, text=True, cwd=folder,
                          timeout=Options().timeout * WALL_FACTOR)  # one grader budget's backstop
    assert done.returncode == 0, done.stderr
    return folder / "gradebook.csv", folder / "report.html"


def test_the_class_report_renders_in_chromium(browser_context, report_page, artifacts):
    gradebook, page_path = report_page
    page = browser_context.new_page()
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(page_path.as_uri())
    images = page.evaluate("() => [...document.images].map(i => [i.alt, i.complete && i.naturalWidth > 0])")
    assert len(images) == 2 and all(ok and alt for alt, ok in images), images
    headings = page.evaluate("() => [...document.querySelectorAll('h2')].map(h => h.textContent)")
    assert headings == ["Score distribution per exercise", "Tests, hardest first", "Slowest submissions",
                        "Learners who scored 0"]
    rows = page.evaluate("() => [...document.querySelectorAll('tr[data-rate]')].map(r => "
                         "[r.dataset.exercise, r.dataset.test, Number(r.dataset.rate)])")
    passed, taken = {}, {}
    with open(gradebook, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["exercise"], row["test"])
            taken[key] = taken.get(key, 0) + 1
            passed[key] = passed.get(key, 0) + (row["passed"] == "True")
    assert {(e, t): r for e, t, r in rows} == pytest.approx({k: passed[k] / taken[k] for k in taken})
    assert [r for _, _, r in rows] == sorted(r for _, _, r in rows)
    slowest = page.evaluate("() => [...document.querySelectorAll('#slowest + table tbody tr')].map(r => "
                            "Number(r.cells[2].textContent))")
    assert slowest == sorted(slowest, reverse=True) and slowest[0] > 30
    zeros = page.evaluate("() => document.querySelectorAll('#zeros + table tbody tr').length")
    assert zeros > 0
    page.screenshot(path=str(artifacts / "class_report.png"), full_page=True)
    assert not errors, errors
    page.close()
