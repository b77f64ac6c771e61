"""The CPU hogs of the grading tests (tests/cpu_hogs.py) end with their test."""
import signal
import subprocess
import sys
import time
from pathlib import Path

from cpu_hogs import cpu_hogs, stop
from grading_budgets import program_backstop

TESTS = Path(__file__).resolve().parent


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for its reaper is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_hogs_spin_and_stop_ends_them():
    hogs = cpu_hogs(2)
    try:
        time.sleep(0.5)
        assert all(hog.poll() is None for hog in hogs), "a hog ended while its test ran"
    finally:
        stop(hogs)
    assert all(hog.returncode is not None for hog in hogs)


def test_hogs_end_when_the_process_that_started_them_is_killed():
    """A pytest worker killed mid-test (SIGKILL: no cleanup of its own runs) leaves no hog behind."""
    program = ("import time\nfrom cpu_hogs import cpu_hogs\n"
               "print(*(hog.pid for hog in cpu_hogs(2)), flush=True)\ntime.sleep(3600)")
    owner = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True, cwd=TESTS)
    try:
        pids = [int(pid) for pid in owner.stdout.readline().split()]
        assert len(pids) == 2 and all(_running(pid) for pid in pids)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + program_backstop()
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in pids), "a CPU hog outlived the process that started it"
