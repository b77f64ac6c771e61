"""CPU-bound processes to run beside a graded run, whose scores must not move (tests/test_grading.py)."""
import subprocess
import sys

# A hog spins, and every tenth of a second reads its stdin: the write end is its test process's
# alone, so an end of file means that process is gone (killed with its pytest worker, even by
# SIGKILL), and the hog ends too rather than spin on for the rest of the run.
HOG = """import os, time
os.set_blocking(0, False)
while True:
    end = time.monotonic() + 0.1
    while time.monotonic() < end:
        pass
    try:
        if os.read(0, 1) == b"":
            break
    except BlockingIOError:
        pass
"""


def cpu_hogs(count: int = 2) -> list[subprocess.Popen]:
    """CPU-bound processes to run beside a graded run, whose scores must not move; `stop` them.
    They end by themselves when the process that started them ends."""
    return [subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE) for _ in range(count)]


def stop(processes: list[subprocess.Popen]):
    for process in processes:
        process.kill()
        process.wait()
        if process.stdin:
            process.stdin.close()
