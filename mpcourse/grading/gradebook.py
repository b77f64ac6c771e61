"""What grading writes: results, the terminal tables and the CSV gradebook, all safe to show.

Reasons and paths may carry text a submission chose. Everything shown (the table, the JSON and
the CSV) has its control characters (ANSI escapes included) and its surrogates written as
visible escapes (`\x1b`, `\ud800`); a file name that is not UTF-8 shows its raw bytes as `\xff`.
So no text a submission returns can make printing or writing fail, nor a terminal act on it.
Every CSV cell that a spreadsheet would read as a formula is escaped with a leading apostrophe;
the gradebook (UTF-8 whatever the locale) is written by `atomic.write_atomically`, so it is
always either the previous or the complete new one. Each submission's wall and CPU seconds are
recorded, so the slow one can be found; `read_gradebook` reads a gradebook back into results
(for LMS imports, the class report and feedback files, without grading again).
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mpcourse.grading.atomic import write_atomically
from mpcourse.grading.judging.selfcheck import TestResult

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")
COLUMNS = ["path", "exercise", "test", "points", "max_points", "passed", "reason", "score", "max_score",
           "error", "notes", "seconds", "cpu_seconds"]


@dataclass
class SubmissionResult:
    path: str
    exercise: str | None
    score: float
    max_score: float
    error: str | None
    tests: list[TestResult] = field(default_factory=list)
    seconds: float = 0.0  # wall-clock seconds its grading took
    notes: list[str] = field(default_factory=list)  # what the instructor should know besides the score
    graded: bool = True  # False: the grader could not grade it (its process died twice, a bug...)
    cpu_seconds: float = 0.0  # CPU seconds of its grading process and every sandbox it started

    def to_json(self) -> dict:
        data = asdict(self)
        data["seconds"], data["cpu_seconds"] = round(self.seconds, 3), round(self.cpu_seconds, 3)
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
    lines = [clean(f"{r.path}  [{r.exercise or '?'}]  {r.score:g}/{r.max_score:g}  "
                   f"({r.seconds:.1f} s, {r.cpu_seconds:.1f} s of CPU)")]
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
        lines.append(f"{clean(r.path):<{width}}  "
                     f"{(r.exercise or '?'):<22}{f'{r.score:g}/{r.max_score:g}':>10}{r.seconds:>8.1f}s")
    lines.append(f"{len(results)} submission(s), {sum(r.seconds for r in results):.1f} seconds of grading, "
                 f"{sum(r.cpu_seconds for r in results):.1f} of CPU")
    if results:
        slowest = max(results, key=lambda r: r.seconds)
        lines.append(clean(f"slowest: {slowest.path}, {slowest.seconds:.1f} s"))
    return "\n".join(lines)


def write_gradebook(results: list[SubmissionResult], path: str | Path) -> None:
    """One row per submission and test, written atomically (a reader never sees half a file)."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(COLUMNS)
    for r in results:
        for t in r.tests or [None]:
            row = [r.path, r.exercise or "", t.id if t else "", t.points if t else 0,
                   t.max_points if t else 0, t.passed if t else False, (t.reason or "") if t else "",
                   r.score, r.max_score, r.error or "", "; ".join(r.notes), f"{r.seconds:.3f}",
                   f"{r.cpu_seconds:.3f}"]
            writer.writerow([spreadsheet_cell(cell) for cell in row])
    write_atomically(path, text.getvalue())


def unescaped(cell: str) -> str:
    """A gradebook cell as it was before `spreadsheet_cell` escaped a formula-like start."""
    return cell[1:] if cell.startswith("'") and cell[1:].startswith(FORMULA_START) else cell


def read_gradebook(path: str | Path) -> list[SubmissionResult]:
    """The submissions of a gradebook `write_gradebook` wrote, in its order (notes split back
    into a list; a gradebook from before timings were recorded reads as 0 seconds)."""
    results: dict[str, SubmissionResult] = {}
    not_one = f"{str(path)!r} is not a gradebook of `mpcourse grade --csv`"
    with open(path, newline="", encoding="utf-8") as f:
        try:
            reader = csv.DictReader(f)
            missing = {"path", "exercise", "test", "points", "max_points", "passed", "score",
                       "max_score"} - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"{not_one}: it lacks the column(s) {', '.join(sorted(missing))}")
            for row in reader:
                _read_row({key: unescaped(value or "") for key, value in row.items()}, results)
        except UnicodeDecodeError:
            raise ValueError(f"{not_one}: it is not UTF-8 text") from None
        except (csv.Error, ValueError, TypeError) as error:
            if str(error).startswith(not_one):
                raise
            raise ValueError(f"{not_one}: line {reader.line_num}: {error}") from None
    return list(results.values())


def _read_row(row: dict[str, str], results: dict[str, SubmissionResult]) -> None:
    """One gradebook line into `results`: its submission's fields (first line), its test."""
    result = results.get(row["path"])
    if result is None:
        result = results[row["path"]] = SubmissionResult(
            row["path"], row["exercise"] or None, float(row["score"]), float(row["max_score"]),
            row.get("error") or None, notes=[n for n in (row.get("notes") or "").split("; ") if n],
            seconds=float(row.get("seconds") or 0), cpu_seconds=float(row.get("cpu_seconds") or 0),
            graded=not (row.get("error") or "").startswith(("not graded", "grading failed")))
    if row["test"]:
        result.tests.append(TestResult(row["test"], float(row["points"]), float(row["max_points"]),
                                       row["passed"] == "True", row.get("reason") or None))
