"""What grading writes: results, the terminal tables and the CSV gradebook, all safe to show.

Reasons and paths may carry text a submission chose. Everything shown (the table, the JSON and
the CSV) has its control characters (ANSI escapes included) and its surrogates written as
visible escapes (`\x1b`, `\ud800`); a file name that is not UTF-8 shows its raw bytes as `\xff`.
So no text a submission returns can make printing or writing fail, nor a terminal act on it.
Every CSV cell that a spreadsheet would read as a formula is escaped with a leading apostrophe;
the gradebook (UTF-8 whatever the locale) is written to a temporary file and renamed over the
old one, so it is always either the previous or the complete new one.
"""
from __future__ import annotations

import csv
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mpcourse.grading.selfcheck import TestResult

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")
COLUMNS = ["path", "exercise", "test", "points", "max_points", "passed", "reason", "score", "max_score",
           "error", "notes"]


@dataclass
class SubmissionResult:
    path: str
    exercise: str | None
    score: float
    max_score: float
    error: str | None
    tests: list[TestResult] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the instructor should know besides the score
    graded: bool = True  # False: the grader could not grade it (its process died twice, a bug...)

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("seconds")
        return _cleaned(data)


def _cleaned(value):
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {k: _cleaned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    return value


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by os.fsdecode's surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def clean(text) -> str:
    """`text` on one line with every control character and surrogate written as an escape:
    printable, encodable as UTF-8, nothing a terminal would interpret."""
    return CONTROL.sub(_escape, str(text).replace("\n", " ").replace("\t", " "))


def not_graded_report(results: list[SubmissionResult]) -> str | None:
    """One line naming each submission that could not be graded, and why (None if all were)."""
    failed = [r for r in results if not r.graded]
    if not failed:
        return None
    return (f"{len(failed)} submission(s) could not be graded: "
            + "; ".join(f"{clean(r.path)}: {clean(r.error)}" for r in failed))


def spreadsheet_cell(value) -> str:
    """A CSV cell that no spreadsheet evaluates: formula-like text gets a leading apostrophe."""
    text = clean(value)
    if text.startswith(FORMULA_START) and not _is_number(text):
        return "'" + text
    return text


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def format_result(r: SubmissionResult) -> str:
    lines = [clean(f"{r.path}  [{r.exercise or '?'}]  {r.score:g}/{r.max_score:g}  ({r.seconds:.1f} s)")]
    for note in ([r.error] if r.error else []) + r.notes:
        lines.append("  note: " + clean(note))
    for t in r.tests:
        lines.append(clean(f"  {t.id:<28}{t.points:g}/{t.max_points:g}  {'pass' if t.passed else 'FAIL'}"
                           + (f"  {t.reason}" if t.reason and not t.passed else "")))
    return "\n".join(lines)


def format_summary(results: list[SubmissionResult]) -> str:
    width = max([len(clean(r.path)) for r in results] + [10])
    lines = ["", f"{'submission':<{width}}  {'exercise':<22}{'score':>10}{'time':>9}"]
    for r in results:
        lines.append(f"{clean(r.path):<{width}}  {(r.exercise or '?'):<22}{f'{r.score:g}/{r.max_score:g}':>10}"
                     f"{r.seconds:>8.1f}s")
    lines.append(f"{len(results)} submission(s), {sum(r.seconds for r in results):.1f} seconds of grading")
    return "\n".join(lines)


def write_gradebook(results: list[SubmissionResult], path: str | Path) -> None:
    """One row per submission and test, written atomically (a reader never sees half a file)."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(handle, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            for r in results:
                for t in r.tests or [None]:
                    row = [r.path, r.exercise or "", t.id if t else "", t.points if t else 0,
                           t.max_points if t else 0, t.passed if t else False, (t.reason or "") if t else "",
                           r.score, r.max_score, r.error or "", "; ".join(r.notes)]
                    writer.writerow([spreadsheet_cell(cell) for cell in row])
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
