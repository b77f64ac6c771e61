import os
import sys

import pytest
import torch

from cached_plans import PLAN_CACHE


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run faster on one thread (no hand-off costs), above all on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def plan_cache(tmp_path_factory):
    """One folder of cached plans (tests/cached_plans.py) for the whole run, all workers together."""
    root = tmp_path_factory.getbasetemp()
    folder = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "plans"
    folder.mkdir(exist_ok=True)
    os.environ[PLAN_CACHE] = str(folder)
    yield folder


# The test files that take longest, longest first; the others follow in pytest's order. The
# Makefile's unit stage hands whole files to two workers in collection order (pytest-xdist's
# --dist loadfile --no-loadscope-reorder), so the long files start at once and the short ones fill
# in at the end, instead of a long file starting last while the other worker has nothing left.
# `make unit` prints its 25 slowest tests (--durations=25): keep this list in step with them.
# The two prediction files come last: they read the graded run test_exercises.py starts.
LONGEST_FIRST = ["test_class_run.py", "test_grading.py", "test_exercises.py", "test_grading_isolation.py",
                 "test_platforms_gradescope.py", "test_grading_verdicts.py", "test_gpu_yardsticks.py",
                 "test_platforms_classroom_lms.py", "test_distributed.py", "test_hosted.py", "test_train.py",
                 "test_nbval_gate.py", "test_package.py", "test_environment.py", "test_makefile.py"]
LAST = ["test_exercise_predictions.py", "test_ex11_prediction.py"]


def run_order(name: str) -> int:
    """Where the test file `name` runs: the longest first, LAST at the end, the rest between."""
    if name in LONGEST_FIRST:
        return LONGEST_FIRST.index(name)
    return len(LONGEST_FIRST) + 1 + LAST.index(name) if name in LAST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    """The test files in `run_order`; off Linux, the `sandbox` tests skipped."""
    items.sort(key=lambda item: run_order(item.path.name))  # stable: a file's tests keep their order
    _skip_sandbox_tests_off_linux(items)


def _skip_sandbox_tests_off_linux(items):
    """Tests marked `sandbox` grade in bubblewrap, which only Linux has: elsewhere (macOS) they
    are skipped, saying so. On Linux they run, and fail when bubblewrap is missing."""
    if sys.platform.startswith("linux"):
        return
    skip = pytest.mark.skip(reason="the grader's sandbox is bubblewrap, which runs on Linux only: "
                                   "grade on Linux (INSTRUCTORS.md, section 3)")
    for item in items:
        if item.get_closest_marker("sandbox"):
            item.add_marker(skip)
