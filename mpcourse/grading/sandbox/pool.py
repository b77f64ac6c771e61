"""Grading processes: one per submission, each under its own memory and time limit, retried once.

The grader decodes every reply and runs the plain tests itself, so a hostile reply reaches a
grading process. Each submission is therefore graded in a process of its own, forked from the
grader once the solutions are planned:

- its address space is limited (`memory`): a reply that makes it allocate too much costs a
  MemoryError in that submission's grading, never the grader's memory or a classmate's grade;
- it has `seconds` of wall clock to finish, a backstop (the grader passes its budgets' CPU
  seconds times the wall-clock factor, `grader.submission_backstop`): a SIGALRM inside it first
  (the grading code turns it into a timed-out result that keeps the points already earned),
  then, `GRACE` seconds later, a kill;
- a process that dies without a result (killed by the kernel's OOM killer, a crash) is started
  again once; if it dies again, or runs out of time, the submission is reported as not graded,
  with why, and the others go on.

At most `jobs` processes run at once. Results come back through a pipe as the grader's own
objects, pickled by this process's own code (no submission runs in it). Forking a process that
has loaded torch is safe on Linux only (macOS's system frameworks abort in a forked child), and
only Linux has the sandbox: elsewhere, reachable only with --unsafe-no-sandbox, submissions are
graded one after the other in the grader's own process, without these limits.
"""
from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import wait

from mpcourse.grading.sandbox.sandbox import stop_every_sandbox
from mpcourse.grading.sandbox.stopping import STOP_SIGNALS, stop_handler, stop_signals_held

GRACE = 30.0  # seconds between the in-process alarm and the kill
STOP_GRACE = 10.0  # seconds a grading process told to stop has to kill its sandboxes, before a kill
ATTEMPTS = 2  # a crashed grading process is retried once


class OutOfTime(Exception):
    """The submission's grading used up its time (raised in the grading process by SIGALRM)."""


@dataclass
class Task:
    index: int
    path: str
    seconds: float
    attempts: int = 0


def _alarm(_signum, _frame):
    raise OutOfTime("the submission's grading used up its time")


def _stop(signum, _frame):
    """A grading process told to stop (the grader was, or Ctrl-C reached the process group):
    its sandboxes die with it, and it exits at once, reporting the signal."""
    stop_every_sandbox()
    os._exit(128 + signum)


def _child(connection, grade, path, memory: int, seconds: float):
    """In the grading process: limits, then the submission's grade sent back to the grader."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS,
                       (memory if hard == resource.RLIM_INFINITY else min(memory, hard), hard))
    signal.signal(signal.SIGALRM, _alarm)
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, stop_handler(_stop))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held back by `_start` until now
    signal.setitimer(signal.ITIMER_REAL, seconds)
    result = grade(path)
    signal.setitimer(signal.ITIMER_REAL, 0)
    connection.send(result)
    connection.close()


def grade_in_processes(paths, grade, seconds_for, jobs: int, memory: int):
    """Yield (index, result, None) or (index, None, why not graded) for each path, as they finish.

    `grade(path)` runs in the grading process; `seconds_for(path)` is its wall-clock backstop.
    However the caller stops (an exception, such as the grader's own SIGTERM, or closing this
    generator), every grading process still running is stopped with its sandboxes (`stop`)."""
    if sys.platform != "linux":
        for index, path in enumerate(paths):
            yield index, grade(path), None
        return
    context = multiprocessing.get_context("fork")
    waiting = [Task(i, p, seconds_for(p)) for i, p in enumerate(paths)]
    waiting.reverse()
    running = {}  # connection -> (task, process, kill time)
    try:
        yield from _run(waiting, running, context, grade, jobs, memory)
    finally:
        stop(running)


def stop(running: dict) -> None:
    """End the grading processes in `running` (connection -> (task, process, kill time)): each is
    told to stop (SIGTERM: it kills its sandboxes and exits), and killed after STOP_GRACE."""
    processes = [process for _, process, _ in running.values()]
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + STOP_GRACE
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
    for connection in running:
        connection.close()
    running.clear()


def _start(task: Task, running: dict, context, grade, memory: int) -> None:
    """Start `task`'s grading process and enter it in `running`, the stop signals held meanwhile,
    so that `stop` finds every process started. They are masked too, so that the new process
    meets them only once it has its own handler (`_child` lets them through)."""
    task.attempts += 1
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(send, grade, task.path, memory, task.seconds),
                              daemon=True)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        with stop_signals_held():
            process.start()
            running[receive] = (task, process, time.monotonic() + task.seconds + GRACE)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        send.close()


def _run(waiting: list, running: dict, context, grade, jobs: int, memory: int):
    """The pool's loop: start tasks up to `jobs`, yield each result or why there is none."""
    while waiting or running:
        while waiting and len(running) < jobs:
            _start(waiting.pop(), running, context, grade, memory)
        soonest = min(kill for _, _, kill in running.values())
        ready = wait(list(running) + [p.sentinel for _, p, _ in running.values()],
                     timeout=max(0.0, soonest - time.monotonic()))
        for connection, (task, process, kill) in list(running.items()):
            result, why = None, None
            if connection in ready or process.sentinel in ready:
                try:
                    result = connection.recv() if connection.poll() else None
                except (EOFError, OSError):
                    result = None
                if result is None:
                    process.join(5)
                    why = _death(process)
            elif time.monotonic() >= kill:
                process.kill()
                why = f"its grading process ran past {task.seconds + GRACE:.0f} s and was killed"
            else:
                continue
            del running[connection]
            connection.close()
            process.join(5)
            if result is None and why.startswith("its grading process died") and task.attempts < ATTEMPTS:
                waiting.append(task)
                continue
            if result is None and task.attempts > 1:
                why += f" (attempt {task.attempts} of {ATTEMPTS})"
            yield task.index, result, why


def _death(process) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"its grading process died: killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"its grading process died: signal {-code}"
    return f"its grading process died: exit status {code}"
