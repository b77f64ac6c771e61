"""The predict-then-measure questions of ex01 and ex06, and ex06's accumulation step, graded on
right, wrong and hostile submissions built from the released exercises.

A prediction is a module-level variable, so it reaches the grader as plain data (`codec`):
an object whose `__eq__` says yes to everything, or a number subclass that does, must not pass,
and neither may a submission that overwrites the measured truth in its own namespace. The ex06
variants are the mistakes the reworked exercise is about: not dividing the loss by the number of
micro-batches, stepping the scaler per micro-batch, and one backward on the summed loss.
"""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from mpcourse.grading.exercise import BEGIN_SOLUTION, END_SOLUTION, without_markers
from mpcourse.grading.release import STUB

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
EX01, EX06 = "ex01_bf16_rounding", "ex06_mixed_precision_step"

EX01_RIGHT = {"PREDICTION_VALUES_IN_1024_2048": "PREDICTION_VALUES_IN_1024_2048 = 2**7",
              "PREDICTION_ROUNDED": "PREDICTION_ROUNDED = 1.0078125",
              "PREDICTION_ERROR_EXPONENT": "PREDICTION_ERROR_EXPONENT = -8"}
EX01_WRONG = {"PREDICTION_VALUES_IN_1024_2048": "PREDICTION_VALUES_IN_1024_2048 = 1024",
              "PREDICTION_ROUNDED": "PREDICTION_ROUNDED = 1.0",
              "PREDICTION_ERROR_EXPONENT": "PREDICTION_ERROR_EXPONENT = -7"}
EX01_HOSTILE = {
    "PREDICTION_VALUES_IN_1024_2048": ("class Anything:\n    def __eq__(self, other):\n        return True\n"
                                       "    __hash__ = object.__hash__\n"
                                       "PREDICTION_VALUES_IN_1024_2048 = Anything()"),
    "PREDICTION_ROUNDED": ("class Sly(float):\n    def __eq__(self, other):\n        return True\n"
                           "    __hash__ = float.__hash__\n"
                           "PREDICTION_ROUNDED = Sly(0.5)"),
    "PREDICTION_ERROR_EXPONENT": "PREDICTION_ERROR_EXPONENT = torch.tensor(-8)"}
# appended after the measuring cells: the submission's own "truth" must not count
EX01_OVERWRITES_TRUTH = "values_in_1024_2048 = rounded = error_exponent = 99\nis_number = lambda value: True"

EX06_RIGHT = {"PREDICTION_SKIPPED_STEPS": "PREDICTION_SKIPPED_STEPS = 3\nPREDICTION_FINAL_SCALE = 2**15"}
EX06_HOSTILE = {"PREDICTION_SKIPPED_STEPS": ("class Anything:\n    def __eq__(self, other):\n        return True\n"
                                             "    __hash__ = object.__hash__\n"
                                             "PREDICTION_SKIPPED_STEPS = 3\nPREDICTION_FINAL_SCALE = Anything()")}


def _solution_step() -> str:
    nb = nbformat.read(ROOT / "solutions" / f"{EX06}.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code" and "def accumulation_step" in c.source)
    return without_markers(source, BEGIN_SOLUTION, END_SOLUTION)


def _variant(old: str, new: str) -> str:
    step = _solution_step()
    assert old in step, f"the solution's step changed: {old!r} is no longer in it"
    return step.replace(old, new)


def _ex06_variants() -> dict[str, str]:
    per_micro_batch = ("    scaler.unscale_(optimizer)          # once: the gradient of the whole batch is complete\n"
                       "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
                       "    scaler.step(optimizer)\n"
                       "    scaler.update()\n")
    return {
        "no_division": _variant("next_token_loss(model(inputs), targets) / count",
                                "next_token_loss(model(inputs), targets)").replace(
                                    "return batch_loss", "return batch_loss / count"),
        "scaler_per_micro_batch": _variant(
            "        batch_loss += loss.item()\n" + per_micro_batch,
            "        batch_loss += loss.item()\n" + "".join("    " + line + "\n" for line in per_micro_batch.splitlines())),
        "one_backward": _variant("        scaler.scale(loss).backward()   # frees this micro-batch's activations\n",
                                 "        losses.append(loss)\n").replace(
                                     "    batch_loss = 0.0\n", "    batch_loss, losses = 0.0, []\n").replace(
                                     "    scaler.unscale_(optimizer)", "    scaler.scale(sum(losses)).backward()\n"
                                                                      "    scaler.unscale_(optimizer)"),
    }


def _submission(folder: Path, exercise: str, name: str, answers: dict[str, str], extra: str | None = None) -> Path:
    """The released exercise with the stubbed cells that mention a key of `answers` filled in."""
    nb = nbformat.read(ROOT / "exercises" / f"{exercise}.ipynb", as_version=4)
    filled = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and STUB[1] in cell.source:
            for key, code in answers.items():
                if key in cell.source:
                    cell.source, filled = code, filled | {key}
    assert filled == set(answers), f"{exercise}: no stubbed cell mentions {set(answers) - filled}"
    if extra:
        nb.cells.insert(len(nb.cells) - 1, nbformat.v4.new_code_cell(extra))
    path = folder / f"{exercise}_{name}.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("predictions")
    variants = _ex06_variants()
    paths = [
        _submission(folder, EX01, "right_predictions", EX01_RIGHT),
        _submission(folder, EX01, "wrong_predictions", EX01_WRONG),
        _submission(folder, EX01, "hostile_predictions", EX01_HOSTILE, extra=EX01_OVERWRITES_TRUTH),
        _submission(folder, EX06, "no_division", dict(EX06_RIGHT, accumulation_step=variants["no_division"])),
        _submission(folder, EX06, "scaler_per_micro_batch",
                    dict(EX06_HOSTILE, accumulation_step=variants["scaler_per_micro_batch"])),
        _submission(folder, EX06, "one_backward", {"accumulation_step": variants["one_backward"]}),
    ]
    result = subprocess.run([sys.executable, "-m", "mpcourse.cli", "grade", *map(str, paths), "--json",
                             "--timeout", "300", "--jobs", "2", "--solutions", str(ROOT / "solutions")],
                            capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert result.returncode == 0, result.stderr
    return {Path(s["path"]).stem: {t["id"]: t for t in s["tests"]} for s in json.loads(result.stdout)["submissions"]}


EX01_PREDICTIONS = ("predict_count_1024_2048", "predict_rounded_value", "predict_largest_error")


def test_right_predictions_earn_their_points_and_nothing_else(graded):
    tests = graded[f"{EX01}_right_predictions"]
    assert {t for t, result in tests.items() if result["passed"]} == set(EX01_PREDICTIONS), tests


def test_a_wrong_prediction_fails_with_the_reasoning(graded):
    tests = graded[f"{EX01}_wrong_predictions"]
    assert not any(tests[t]["passed"] for t in EX01_PREDICTIONS), tests
    assert "you predicted 1024, torch counts 128" in tests["predict_count_1024_2048"]["reason"]
    assert "you predicted 1.0, torch gives 1.0078125" in tests["predict_rounded_value"]["reason"]
    assert "you predicted 2**-7, the largest error is just below 2**-8" in tests["predict_largest_error"]["reason"]


def test_a_prediction_that_equals_anything_or_overwrites_the_truth_fails(graded):
    tests = graded[f"{EX01}_hostile_predictions"]
    assert not any(tests[t]["passed"] for t in EX01_PREDICTIONS), tests
    assert "NameError" in tests["predict_count_1024_2048"]["reason"]  # not plain data: it never crosses
    assert "you predicted 0.5" in tests["predict_rounded_value"]["reason"]  # only the float's value crosses
    assert "write a plain number, got Tensor" in tests["predict_largest_error"]["reason"]


def test_ex06_prediction_is_graded_and_a_hostile_one_fails(graded):
    assert graded[f"{EX06}_no_division"]["predict_skipped_steps"]["passed"]
    assert not graded[f"{EX06}_scaler_per_micro_batch"]["predict_skipped_steps"]["passed"]
    assert "NameError" in graded[f"{EX06}_scaler_per_micro_batch"]["predict_skipped_steps"]["reason"]
    assert not graded[f"{EX06}_one_backward"]["predict_skipped_steps"]["passed"]


def test_forgetting_to_divide_the_loss_changes_the_update(graded):
    tests = graded[f"{EX06}_no_division"]
    assert not tests["same_update_as_one_batch"]["passed"], tests
    assert tests["disabled_scaler_is_plain_training"]["passed"], "with one micro-batch, dividing by 1 changes nothing"


def test_stepping_the_scaler_per_micro_batch_is_caught(graded):
    tests = graded[f"{EX06}_scaler_per_micro_batch"]
    for test in ("one_step_per_call", "same_update_as_one_batch", "overflow_is_skipped", "clip_after_unscale"):
        assert not tests[test]["passed"], (test, tests)
    # the learner reads the test's own hint: four overflowing updates, 2**40 / 2**4 = 2**36
    assert "expected 2**39, got 2**36" in tests["overflow_is_skipped"]["reason"], tests["overflow_is_skipped"]
    assert tests["disabled_scaler_is_plain_training"]["passed"], "with one micro-batch, per micro-batch is per step"


def test_one_backward_on_the_summed_loss_keeps_every_micro_batch_in_memory(graded):
    tests = graded[f"{EX06}_one_backward"]
    assert not tests["one_micro_batch_in_memory"]["passed"], tests
    assert "only one micro-batch's activations are alive" in tests["one_micro_batch_in_memory"]["reason"]
    for test in ("same_update_as_one_batch", "autocast_forward_backward_outside", "overflow_is_skipped"):
        assert tests[test]["passed"], f"{test}: the update itself is right, only the memory test may catch it"
