"""Judging one exercise: its notebook (`exercise`), the learner's `check()` (`selfcheck`), the
grader's side of the wall (`judge`), the values that cross it (`codec`, `states`), a test's
`verdict`, the course's own answers a learner must write (`stubs`) and `release`, which writes the
learner's notebook from the solution.

Light on purpose: nothing is imported here (`mpcourse.grading` hands on `check` and `watch`)."""
