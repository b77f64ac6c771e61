"""The instructor's tools around grading, each on its own: the atomic writer, the gradebook read
back, collect on Moodle's download layouts, feedback pages, the class report and the progress bar.

No submission runs here: results are made by hand (the class run in tests/test_class_run.py
grades real ones), so these checks are quick and say exactly which piece broke.
"""
import csv
import html
import io
import json
import os
import pty
import select
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from mpcourse.grading.instructor import collect, feedback, progress, report
from mpcourse.grading import gradebook
from mpcourse.grading.atomic import write_atomically
from mpcourse.grading.gradebook import SubmissionResult
from mpcourse.grading.judging.selfcheck import TestResult as Verdict

ROOT = Path(__file__).resolve().parents[1]
NAMES = [p.stem for p in sorted((ROOT / "solutions").glob("ex*.ipynb"))]


def test_the_atomic_writer_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "results.json"
    write_atomically(target, "old")
    write_atomically(target, '{"new": 1}', mode=0o600)
    assert json.loads(target.read_text()) == {"new": 1} and os.stat(target).st_mode & 0o777 == 0o600
    assert list(target.parent.iterdir()) == [target]


def _result(path, exercise="ex00_bytes", passed=(True, False), seconds=1.0, error=None, reason="wrong size"):
    tests = [Verdict(f"t{i}", 1.0 if ok else 0.0, 1.0, ok, None if ok else reason) for i, ok in enumerate(passed)]
    return SubmissionResult(path, exercise, float(sum(passed)), float(len(passed)), error, tests, seconds,
                            ["a note"], cpu_seconds=seconds / 2)


def test_a_gradebook_reads_back_as_the_results_it_was_written_from(tmp_path):
    results = [_result("s/ada/ex00_bytes.ipynb", seconds=2.5), _result("s/=ben/ex00_bytes.ipynb", passed=(False,),
                                                                         error="timed out", reason="=formula")]
    gradebook.write_gradebook(results, tmp_path / "g.csv")
    back = gradebook.read_gradebook(tmp_path / "g.csv")
    assert [(r.path, r.score, r.error, r.notes, r.seconds, r.cpu_seconds) for r in back] == \
        [(r.path, r.score, r.error, r.notes, r.seconds, r.cpu_seconds) for r in results]
    assert back[1].tests == results[1].tests  # "=formula" escaped in the CSV, itself again when read
    (tmp_path / "bad.csv").write_text("name,score\nada,1\n")
    with pytest.raises(ValueError, match="not a gradebook"):
        gradebook.read_gradebook(tmp_path / "bad.csv")


def _moodle_zip(path: Path, folders: bool) -> Path:
    """A Moodle 'Download all submissions' zip, in folders (default since 3.1) or flat."""
    nb = (ROOT / "exercises" / "ex00_bytes.ipynb").read_bytes()
    entries = [("Ada Lovelace_101_assignsubmission_file", "ex00_bytes.ipynb", nb, (2026, 3, 1, 9, 0, 0)),
               ("Ada Lovelace_101_assignsubmission_file", "ex00 (copy).ipynb", nb + b" ", (2026, 3, 1, 10, 0, 0)),
               ("Ben Bitdiddle_102_assignsubmission_file", "ex01_bf16_rounding.ipynb", nb, (2026, 3, 1, 9, 0, 0)),
               ("Ben Bitdiddle_102_assignsubmission_onlinetext", "onlinetext.html", b"<p>hi</p>",
                (2026, 3, 1, 9, 0, 0))]
    with zipfile.ZipFile(path, "w") as zf:
        for prefix, name, data, when in entries:
            member = f"{prefix}_/{name}" if folders else f"{prefix}_{name}"
            zf.writestr(zipfile.ZipInfo(member, date_time=when), data)
    return path


@pytest.mark.parametrize("folders", [True, False], ids=["in-folders", "flat"])
def test_collect_reads_moodles_download_and_maps_names_to_logins(tmp_path, folders):
    roster = tmp_path / "roster.csv"
    roster.write_text("name,login\nAda Lovelace,alovelace\n")
    found = collect.collect("moodle", _moodle_zip(tmp_path / "moodle.zip", folders), tmp_path / "subs", NAMES,
                            roster)
    assert sorted(found.placed) == [("Ben_Bitdiddle", "ex01_bf16_rounding"), ("alovelace", "ex00_bytes")]
    kept = (tmp_path / "subs" / "alovelace" / "ex00_bytes.ipynb").read_bytes()
    assert kept.endswith(b" "), "the newer upload (10:00) is the one kept"
    messages = "\n".join(found.messages)
    assert "alovelace: 2 uploads of ex00_bytes: kept the newest, 'ex00 (copy).ipynb' (2026-03-01 10:00:00)" \
        in messages
    assert "onlinetext" in messages  # not a file submission: reported, not placed
    rows = list(csv.DictReader((tmp_path / "subs" / "learners.csv").open()))
    assert {r["learner"]: (r["name"], r["lms_id"]) for r in rows}["alovelace"] == ("Ada Lovelace", "alovelace")


def test_collect_refuses_what_is_not_a_download(tmp_path):
    (tmp_path / "x.txt").write_text("no")
    with pytest.raises(ValueError, match="neither a folder nor a zip"):
        collect.collect("canvas", tmp_path / "x.txt", tmp_path / "out", NAMES)
    with pytest.raises(ValueError, match="canvas, moodle"):
        collect.collect("sakai", tmp_path, tmp_path / "out", NAMES)


def test_canvas_names_parse_as_canvas_writes_them():
    upload = collect.Upload("lovelaceada_LATE_4242_91_ex00_bytes-1.ipynb", b"{}", ())
    parsed = collect.parse("canvas", upload, {})
    assert (parsed.learner, parsed.name, parsed.late, parsed.order, parsed.file) == \
        ("4242", "lovelaceada", True, 91, "ex00_bytes-1.ipynb")
    anonymous = collect.parse("canvas", collect.Upload("anon_x1Y2_77_my_ex00.ipynb", b"{}", ()), {})
    assert anonymous.learner == "anon_x1Y2" and anonymous.file == "my_ex00.ipynb"
    assert collect.parse("canvas", collect.Upload("readme.txt", b"x", ()), {}) is None


def test_feedback_escapes_the_notebook_and_withholds_a_reason_quoting_a_hidden_line(tmp_path):
    nb = nbformat.read(ROOT / "exercises" / "ex00_bytes.ipynb", as_version=4)
    nb.cells[3].source = "def tensor_bytes(n, d):\n    return '<script>alert(1)</script>'"
    path = tmp_path / "ada" / "ex00_bytes.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    hidden = feedback.hidden_lines(ROOT / "solutions")["ex00_bytes"]
    leak = sorted(hidden)[0]
    result = SubmissionResult(str(path), "ex00_bytes", 1.0, 4.0, None, [
        Verdict("fp32_ten_million", 1.0, 1.0, True, None),
        Verdict("fp16_ten_million", 0.0, 1.0, False, "expected 20,000,000 <b>bold</b>"),
        Verdict("any_size_matches_torch", 0.0, 1.0, False, f"quoted: {leak}")])
    page = feedback.page(result, hidden)
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>bold" not in page
    assert leak not in html.unescape(page) and feedback.WITHHELD in page
    order = [page.index(f'data-test="{t}"') for t in ("fp32_ten_million", "fp16_ten_million")]
    assert order == sorted(order) and page.index("def tensor_bytes") < order[0]  # below the answer, in order


def test_the_report_sorts_tests_hardest_first_and_lists_zeros_and_the_slowest():
    results = [_result("s/ada/ex00_bytes.ipynb", passed=(True, True), seconds=3.0),
               _result("s/ben/ex00_bytes.ipynb", passed=(True, False), seconds=9.0),
               _result("s/cy/ex00_bytes.ipynb", passed=(False, False), seconds=1.0, error="timed out: a loop")]
    rates = report.pass_rates(results)
    assert [(r.test, r.passed, r.taken) for r in rates] == [("t1", 1, 3), ("t0", 2, 3)]
    assert rates[0].common_reason == "wrong size"
    assert report.zero_scores(results) == [("cy", "ex00_bytes", "timed out: a loop")]
    page = report.report_html(results)
    assert page.index("s/ben/ex00_bytes.ipynb") < page.index("s/ada/ex00_bytes.ipynb")  # slowest first
    assert page.count('<img alt="') == 2


def test_the_progress_bar_shows_on_a_terminal_that_reports_no_size(monkeypatch):
    """A pty opened without a size (as `script` or `docker exec -t` give) has 0 rows and columns,
    where tqdm draws nothing: the bar takes a default size instead. Drawn on stderr, as in
    `mpcourse grade`, since tqdm reads the terminal's size only for stderr and stdout."""
    leader, follower = pty.openpty()
    assert tuple(os.get_terminal_size(follower)) == (0, 0)
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        bar = progress.Progress(2)
        for path in ("s/ada/ex00.ipynb", "s/ben/ex00.ipynb"):
            bar.done(_result(path, seconds=1.0))
        bar.close()
        terminal.flush()
    shown = b""
    while select.select([leader], [], [], 1.0)[0]:
        try:
            shown += os.read(leader, 1 << 16)
        except OSError:  # the follower is closed and everything was read
            break
    os.close(leader)
    shown = shown.decode()
    assert "grading: 100%" in shown and "2/2" in shown, repr(shown)


def test_the_progress_bar_counts_submissions_and_names_the_slowest():
    stream = io.StringIO()
    bar = progress.Progress(3, stream=stream, enabled=True)
    for path, seconds in (("s/ada/ex00.ipynb", 2.0), ("s/ben/ex00.ipynb", 7.5), ("s/cy/ex00.ipynb", 1.0)):
        bar.done(_result(path, seconds=seconds))
    bar.close()
    shown = stream.getvalue()
    assert "3/3" in shown and "slowest ben/ex00.ipynb 7.5 s" in shown.rsplit("\r", 1)[-1]
    quiet = io.StringIO()
    progress.Progress(1, stream=quiet).close()  # not a terminal: no bar
    assert quiet.getvalue() == ""
    line = json.loads(progress.json_line(4, _result("s/ada/ex00.ipynb", seconds=2.0)))
    assert line["index"] == 4 and line["seconds"] == 2.0 and line["cpu_seconds"] == 1.0
