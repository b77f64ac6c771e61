"""How the grader and its grading processes stop on SIGTERM or SIGINT without losing a process.

A process that starts another and records it (a grading process in the pool, a worker in a
sandbox) must not be stopped between the two, or the stop would not find it. A signal mask cannot
promise that: CPython runs a Python handler in the main thread whichever thread the signal
reached. So the stop's handlers are wrapped (`stop_handler`) to wait while the main thread is in a
`stop_signals_held` block, and run at its end.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}  # what tells the grader and its processes to stop
_HELD = {"depth": 0, "pending": None}  # the main thread's `stop_signals_held` blocks, a signal they hold
os.register_at_fork(after_in_child=lambda: _HELD.update(depth=0, pending=None))


def stop_handler(handler):
    """`handler` as a handler of STOP_SIGNALS that waits while the main thread is in a
    `stop_signals_held` block. (A Python handler runs in the main thread whichever thread the
    signal reached, so a signal mask alone cannot keep it out of a block.)"""
    def run(signum, frame):
        if _HELD["depth"]:
            _HELD["pending"] = signum
            return
        handler(signum, frame)
    return run


@contextlib.contextmanager
def stop_signals_held():
    """A block that a `stop_handler` does not interrupt: one that starts a process and records it,
    so that the stop finds every process started. A signal meanwhile is handled at its end."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers run in the main thread only; this thread's starts check _STOPPING after
        return
    _HELD["depth"] += 1
    try:
        yield
    finally:
        _HELD["depth"] -= 1
        if not _HELD["depth"] and _HELD["pending"] is not None:
            signum, _HELD["pending"] = _HELD["pending"], None
            handler = signal.getsignal(signum)
            if callable(handler):
                handler(signum, None)
