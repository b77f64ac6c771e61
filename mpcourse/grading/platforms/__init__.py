"""Grading a large class on the platforms instructors already use.

- `gradescope_zip` writes a Gradescope autograder (setup.sh, run_autograder, the solutions and
  the course), and `gradescope_run` is what runs inside Gradescope's container for each submission;
  `gradescope_results` turns the grader's results into Gradescope's results.json.
- `classroom` writes a GitHub Actions workflow that runs an exercise's visible tests in a
  learner's repository (never the hidden ones: anything a workflow can read, its learner can).
- `lms` turns the grader's per-test gradebook into a Canvas or Moodle gradebook import.

Each uses the grader only through `mpcourse grade`'s own functions (load_exercises,
plan_exercises, grade_submission, SubmissionResult), so it grades exactly as the local grader does.
"""
