"""`mpcourse feedback`: one HTML page per learner and exercise, and a zip per learner to upload.

Each page is the learner's own notebook, cell by cell, with each test's verdict, points and
reason right below the test cell it concerns (tests whose cell the learner deleted are listed at
the end). Everything the learner or the grader wrote is HTML-escaped: a notebook cannot put
script or markup into the page. No hidden test text can appear: the page shows only the
learner's cells (hidden lines are removed from their copy by `mpcourse release`) and the
gradebook's reasons, and a reason that quotes any line of the solution's hidden tests is
withheld, whatever let it through.
"""
from __future__ import annotations

import html
import io
import zipfile
from collections import defaultdict
from pathlib import Path

import nbformat

from mpcourse.grading.atomic import write_atomically
from mpcourse.grading.judging.exercise import BEGIN_HIDDEN, END_HIDDEN, find_solutions
from mpcourse.grading.gradebook import SubmissionResult, read_gradebook
from mpcourse.grading.platforms.lms import learner_of
from mpcourse.grading.judging.selfcheck import TestResult

WITHHELD = "(reason withheld: it quoted a hidden test)"
STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;
color:#1b1b1b}
pre{background:#f6f6f6;padding:.6rem;border-radius:4px;overflow-x:auto;white-space:pre-wrap}
.markdown{background:none;border-left:3px solid #ddd}
.verdict{margin:.2rem 0 1.2rem;padding:.5rem .8rem;border-radius:4px}
.pass{background:#e6f4ea;border-left:4px solid #1e7b34}.fail{background:#fdecea;border-left:4px solid #b3261e}
.note{color:#555}"""


def hidden_lines(solutions: str | Path) -> dict[str, set[str]]:
    """exercise name -> the stripped, non-trivial lines of its solution's hidden tests."""
    found = {}
    for path in find_solutions(solutions).values():
        lines, inside = set(), False
        for cell in nbformat.read(path, as_version=4).cells:
            for line in cell.source.splitlines() if cell.cell_type == "code" else ():
                stripped = line.strip()
                if stripped == BEGIN_HIDDEN:
                    inside = True
                elif stripped == END_HIDDEN:
                    inside = False
                elif inside and len(stripped) >= 12:
                    lines.add(stripped)
        found[path.stem] = lines
    return found


def safe_reason(reason: str | None, hidden: set[str]) -> str:
    """The reason, unless it quotes a hidden line."""
    text = reason or ""
    return WITHHELD if any(line in text for line in hidden) else text


def _verdict(test: TestResult, hidden: set[str]) -> str:
    kind = "pass" if test.passed else "fail"
    reason = "" if test.passed else f": {html.escape(safe_reason(test.reason, hidden))}"
    return (f'<div class="verdict {kind}" data-test="{html.escape(test.id)}"><b>{html.escape(test.id)}</b> '
            f"{test.points:g}/{test.max_points:g} {'passed' if test.passed else 'failed'}{reason}</div>")


def page(result: SubmissionResult, hidden: set[str]) -> str:
    """The feedback page for one graded submission."""
    by_id, shown = {t.id: t for t in result.tests}, set()
    title = f"{result.exercise}: {result.score:g}/{result.max_score:g}"
    body = [f"<h1>{html.escape(title)}</h1>"]
    for note in ([result.error] if result.error else []) + result.notes:
        body.append(f'<p class="note">{html.escape(safe_reason(note, hidden))}</p>')
    try:
        cells = nbformat.read(result.path, as_version=4).cells
    except Exception as error:  # noqa: BLE001: an unreadable notebook still gets its verdicts
        cells = []
        body.append(f'<p class="note">Your notebook could not be shown '
                    f'({html.escape(type(error).__name__)}); '
                    "the verdicts follow.</p>")
    for cell in cells:
        kind = "markdown" if cell.cell_type == "markdown" else "code"
        body.append(f'<pre class="{kind}">{html.escape(cell.source)}</pre>')
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id") if cell.cell_type == "code" else None
        if grade_id in by_id and grade_id not in shown:
            shown.add(grade_id)
            body.append(_verdict(by_id[grade_id], hidden))
    rest = [t for t in result.tests if t.id not in shown]
    if rest:
        body.append("<h2>Tests whose cell is not in your notebook</h2>")
        body.extend(_verdict(t, hidden) for t in rest)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")


def write_feedback(gradebook: str | Path, solutions: str | Path, out: str | Path) -> dict[str, list[Path]]:
    """Write `out/<learner>/<exercise>.html` and `out/<learner>.zip`; returns learner -> pages."""
    hidden, out = hidden_lines(solutions), Path(out)
    pages: dict[str, list[Path]] = defaultdict(list)
    for result in read_gradebook(gradebook):
        if not result.exercise:
            continue
        learner = learner_of(result.path)
        learner = learner if learner not in ("", ".", "..") else "unnamed"  # never a folder outside `out`
        pages[learner].append(write_atomically(out / learner / f"{result.exercise}.html",
                                               page(result, hidden.get(result.exercise, set()))))
    for learner, written in pages.items():
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in written:
                zf.writestr(path.name, path.read_bytes())
        write_atomically(out / f"{learner}.zip", buffer.getvalue())
    return dict(pages)
