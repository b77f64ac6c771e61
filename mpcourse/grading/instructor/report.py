"""`mpcourse report`: the class at a glance, one HTML page from a gradebook.

The page shows what an instructor asks after a run: how scores spread in each exercise; which
tests most learners fail, hardest first, with the reason most of them got; which submissions
took longest to grade; and who scored 0, and why (a timeout, a notebook that would not parse).
Pictures are matplotlib PNGs embedded in the page, so it is one file to keep or send; every
number is also in a table, for screen readers and for copying.
"""
from __future__ import annotations

import base64
import html
import io
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from mpcourse.grading.atomic import write_atomically
from mpcourse.grading.gradebook import SubmissionResult, read_gradebook
from mpcourse.grading.platforms.lms import learner_of

SLOWEST_SHOWN = 10
STYLE = """body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;
color:#1b1b1b}
table{border-collapse:collapse;margin:1rem 0}th,td{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}
th{background:#f0f0f0}td.number{text-align:right}img{max-width:100%}"""


@dataclass(frozen=True)
class TestRate:
    """How one test went across the class."""
    exercise: str
    test: str
    passed: int
    taken: int
    common_reason: str  # the reason most failing submissions got ("" when none failed)

    @property
    def rate(self) -> float:
        return self.passed / self.taken if self.taken else 0.0


def pass_rates(results: list[SubmissionResult]) -> list[TestRate]:
    """Each test's pass rate over the submissions of its exercise, hardest first."""
    passed, taken, reasons = Counter(), Counter(), defaultdict(Counter)
    for result in results:
        for test in result.tests:
            key = (result.exercise or "?", test.id)
            taken[key] += 1
            passed[key] += test.passed
            if not test.passed:
                reasons[key][test.reason or "failed"] += 1
    rates = [TestRate(e, t, passed[e, t], taken[e, t],
                      reasons[e, t].most_common(1)[0][0] if reasons[e, t] else "")
             for e, t in taken]
    return sorted(rates, key=lambda r: (r.rate, r.exercise, r.test))


def zero_scores(results: list[SubmissionResult]) -> list[tuple[str, str, str]]:
    """(learner, exercise, why) for every submission that scored 0."""
    rows = []
    for r in results:
        if r.score == 0:
            first_fail = next((t.reason for t in r.tests if not t.passed and t.reason), "every test failed")
            rows.append((learner_of(r.path), r.exercise or "?", r.error or first_fail))
    return sorted(rows)


def _png(figure) -> str:
    import matplotlib.pyplot as plt
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _image(figure, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{_png(figure)}">'


def score_figure(results: list[SubmissionResult]):
    """One histogram per exercise: how many submissions got each score."""
    import matplotlib.pyplot as plt
    exercises = sorted({r.exercise for r in results if r.exercise})
    figure, axes = plt.subplots(1, max(1, len(exercises)),
                                figsize=(4 * max(1, len(exercises)), 3), squeeze=False)
    for ax, exercise in zip(axes[0], exercises):
        mine = [r for r in results if r.exercise == exercise]
        top = max(r.max_score for r in mine)
        scores = Counter(r.score for r in mine)
        ax.bar(list(scores), list(scores.values()), width=max(top, 1) / 20, color="#3b6ea5")
        ax.set_xlim(-top * 0.05 - 0.5, top * 1.05 + 0.5)
        ax.set_title(exercise)
        ax.set_xlabel(f"score (of {top:g})")
        ax.set_ylabel("submissions")
    return figure


def rates_figure(rates: list[TestRate]):
    """Each test's pass rate as a horizontal bar, hardest at the top."""
    import matplotlib.pyplot as plt
    figure, ax = plt.subplots(figsize=(8, 0.3 * len(rates) + 1))
    labels = [f"{r.exercise}: {r.test}" for r in rates]
    ax.barh(labels, [100 * r.rate for r in rates], color="#b3261e")
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("submissions passing (%)")
    return figure


def _table(header: list[str], rows: list[list], numeric: set[int] = frozenset(), attrs=None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for index, row in enumerate(rows):
        extra = attrs(index) if attrs else ""
        cells = "".join(f'<td{" class=number" if i in numeric else ""}>{html.escape(str(c))}</td>'
                        for i, c in enumerate(row))
        body.append(f"<tr{extra}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def report_html(results: list[SubmissionResult], title: str = "Class report") -> str:
    """The whole page."""
    import matplotlib
    matplotlib.use("Agg")
    rates, graded = pass_rates(results), [r for r in results if r.exercise]
    slowest = sorted(results, key=lambda r: r.seconds, reverse=True)[:SLOWEST_SHOWN]
    zeros = zero_scores(graded)
    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<p>{len(graded)} graded submission(s) from {len({learner_of(r.path) for r in graded})} "
             f"learner(s); {sum(r.seconds for r in results):.0f} s of grading in all.</p>",
             '<h2 id="scores">Score distribution per exercise</h2>',
             _image(score_figure(graded),
                    "Histograms, one per exercise, of how many submissions got each score"),
             _table(["exercise", "submissions", "mean score", "max score", "full marks"],
                    [[e, len(m), f"{sum(r.score for r in m) / len(m):.2f}", f"{m[0].max_score:g}",
                      sum(r.score == r.max_score for r in m)]
                     for e in sorted({r.exercise for r in graded})
                     for m in [[r for r in graded if r.exercise == e]]], numeric={1, 2, 3, 4}),
             '<h2 id="tests">Tests, hardest first</h2>',
             _image(rates_figure(rates),
                    "Horizontal bars: the share of submissions passing each test, hardest "
                                         "at the top") if rates else "<p>No tests were graded.</p>",
             _table(["exercise", "test", "passed", "of", "pass rate", "most common reason for failing"],
                    [[r.exercise, r.test, r.passed, r.taken, f"{100 * r.rate:.0f}%",
                      r.common_reason] for r in rates],
                    numeric={2, 3, 4}, attrs=lambda i: (f' data-exercise="{html.escape(rates[i].exercise)}" '
                                                       f'data-test="{html.escape(rates[i].test)}" '
                                                       f'data-rate="{rates[i].rate:.6f}"')),
             '<h2 id="slowest">Slowest submissions</h2>',
             _table(["submission", "exercise", "wall seconds", "CPU seconds", "score"],
                    [[r.path, r.exercise or "?", f"{r.seconds:.1f}", f"{r.cpu_seconds:.1f}",
                      f"{r.score:g}/{r.max_score:g}"] for r in slowest], numeric={2, 3}),
             '<h2 id="zeros">Learners who scored 0</h2>',
             _table(["learner", "exercise", "reason"], [list(z) for z in zeros]) if zeros
             else "<p>Nobody scored 0.</p>"]
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n")


def write_report(gradebook: str | Path, out: str | Path) -> Path:
    """Read `gradebook` and write the report page to `out`."""
    results = read_gradebook(gradebook)
    return write_atomically(out, report_html(results, f"Class report: {Path(gradebook).name}"))
