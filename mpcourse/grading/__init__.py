"""Graded exercises: authoring conventions, `release`, the learner's `check()` and the grader.

`check` and `watch` load torch when first used, not on import, so the instructor's commands
(`grading.instructor.commands`) keep `mpcourse --help` fast."""
import importlib

__all__ = ["check", "watch"]
_HOMES = {"check": "mpcourse.grading.judging.selfcheck", "watch": "mpcourse.grading.judging.states"}


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'mpcourse.grading' has no attribute {name!r}")
