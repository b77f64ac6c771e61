"""`mpcourse grade` ends with its owner: a SIGTERM (a supervisor's stop) or a SIGINT to its process
group (Ctrl-C in a terminal) ends every grading process and sandbox, writes the gradebook of the
submissions that finished, and exits with 128 + the signal's number.

A real class runs in bubblewrap's sandbox: one correct answer, which finishes, beside answers that
never do (an endless loop, and 32 spinners each in a session of its own, which escape a process
group). This test process is made the "subreaper" of the run, so that any process of the run left
behind, even one that detached itself, becomes its child and is found.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpcourse.grading.gradebook import read_gradebook
from mpcourse.grading.grader import CALIBRATION_SECONDS, Options, submission_backstop
from mpcourse.grading.sandbox import pool
from mpcourse.grading.sandbox.limits import WALL_FACTOR

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"
CLASS = {"ada": "ex00_correct", "bob": "ex00_setsid_spinners", "cy": "ex00_endless_loop",
         "dee": "ex00_endless_loop"}
PR_SET_CHILD_SUBREAPER = 36
#: How long the first result may take: the solution's planning and one submission's grading,
#: each at its wall-clock backstop (the grader's own bounds; on an idle machine it takes ~15 s).
FIRST_RESULT_BUDGET = CALIBRATION_SECONDS * WALL_FACTOR + submission_backstop(None, Options())
#: How long the stop may take: the pool gives its processes STOP_GRACE, then kills them; then the
#: grader sweeps control groups and writes the gradebook.
STOP_BUDGET = 3 * pool.STOP_GRACE


@contextlib.contextmanager
def _subreaper():
    """This process adopts the run's orphans while the block runs; yields a function listing the
    processes it holds that it did not hold before (the run's), which are killed after the block."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = set(_descendants(os.getpid()))  # e.g. a multiprocessing helper of an earlier test

    def new(zombies: bool = False) -> list[int]:
        return [pid for pid in _descendants(os.getpid(), zombies) if pid not in before]
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    try:
        yield new
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in new():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap(new(zombies=True))


def _processes(zombies: bool = False) -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, name) of every process now (a zombie is dead already:
    its parent has not waited for it yet)."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if zombies or fields[0] != "Z":
                table[int(entry.name)] = (int(fields[1]), int(fields[2]), name)
    return table


def _descendants(root: int, zombies: bool = False) -> list[int]:
    table, found, todo = _processes(zombies), [], [root]
    while todo:
        parent = todo.pop()
        children = [pid for pid, (ppid, _, _) in table.items() if ppid == parent]
        found += children
        todo += children
    return found


def _reap(pids) -> None:
    """Wait for those of `pids` that died and are this process's children (adopted)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _sandboxes(grader: int) -> list[int]:
    """The bubblewrap processes the grader's run holds now."""
    table = _processes()
    return [pid for pid in _descendants(grader) if pid in table and table[pid][2] == "bwrap"]


def _line(stream, budget: float) -> str:
    """The next line of `stream`, waited for at most `budget` seconds ("" if none came)."""
    ready, _, _ = select.select([stream], [], [], budget)
    return stream.readline() if ready else ""


def _wait_for(condition, budget: float, what: str):
    deadline = time.monotonic() + budget
    while not (found := condition()):
        assert time.monotonic() < deadline, f"{what() if callable(what) else what} within {budget:.0f} s"
        time.sleep(0.2)
    return found


@pytest.fixture
def class_folder(tmp_path) -> Path:
    for learner, fixture in CLASS.items():
        (tmp_path / learner).mkdir()
        shutil.copy(FIXTURES / f"{fixture}.ipynb", tmp_path / learner / "ex00_bytes.ipynb")
    return tmp_path


@pytest.mark.parametrize("signum, to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["SIGTERM to the grader", "SIGINT to its process group (Ctrl-C)"])
def test_a_stopped_grade_leaves_no_process_and_keeps_what_finished(class_folder, signum, to_group):
    paths = [f"{learner}/ex00_bytes.ipynb" for learner in CLASS]
    command = [sys.executable, "-m", "mpcourse.cli", "grade", "--jobs", "2", "--jsonl",
               "--csv", "gradebook.csv", *paths]
    with _subreaper() as run_processes:
        grader = subprocess.Popen(command, cwd=class_folder, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            first = json.loads(_line(grader.stdout, FIRST_RESULT_BUDGET) or "null")
            assert first is not None and first["path"] == "ada/ex00_bytes.ipynb", grader.stderr.read()
            _wait_for(lambda: _sandboxes(grader.pid) or grader.poll() is not None,
                      submission_backstop(None, Options()), "the next sandboxes start")
            assert grader.poll() is None, f"the grader ended by itself: {grader.communicate()[1]}"
            if to_group:
                os.killpg(grader.pid, signum)
            else:
                grader.send_signal(signum)
            out, err = grader.communicate(timeout=STOP_BUDGET)
        finally:
            if grader.poll() is None:
                grader.kill()
                grader.wait()

        def gone() -> bool:  # a process SIGKILLed as the grader exits may take a moment to go
            _reap(run_processes(zombies=True))
            in_group = [pid for pid, (_, group, _) in _processes().items() if group == grader.pid]
            return not run_processes() and not in_group
        _wait_for(gone, pool.STOP_GRACE, lambda: f"every process of the run ends (left: {run_processes()})")
    assert grader.returncode == 128 + signum, err
    assert "sandbox: bubblewrap" in err, "the hostile answers run in bubblewrap only"
    finished = [first["path"]] + [json.loads(line)["path"] for line in out.splitlines()]
    assert f"stopped by {signal.Signals(signum).name}: {len(finished)} of 4 submission(s) graded" in err
    book = read_gradebook(class_folder / "gradebook.csv")
    assert [r.path for r in book] == finished and "cy/ex00_bytes.ipynb" not in finished
    assert book[0].score == book[0].max_score == 4.0, "the finished answer keeps its score"
