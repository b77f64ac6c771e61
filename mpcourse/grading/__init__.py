"""Graded exercises: authoring conventions, `release`, the learner's `check()` and the grader."""
from mpcourse.grading.codec import watch
from mpcourse.grading.selfcheck import check

__all__ = ["check", "watch"]
