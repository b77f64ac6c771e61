"""The predict-then-measure questions of ex01, ex06 and ex10, and ex06's accumulation step, graded
on right, wrong and hostile submissions built from the released exercises; and, for ex10 and ex11,
that no visible prediction test tells a wrong answer the right one.

A prediction is a module-level variable, so it reaches the grader as plain data (`codec`):
an object whose `__eq__` says yes to everything, or a number subclass that does, must not pass,
and neither may a submission that overwrites the measured truth in its own namespace. The ex06
variants are the mistakes the reworked exercise is about: not dividing the loss by the number of
micro-batches, stepping the scaler per micro-batch, and one backward on the summed loss.
"""
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch
from exercise_run import graded_exercises

from mpcourse.lowbit import blockscale
from mpcourse.lowbit.blockscale import (MXFP4, MXFP4_RCEIL, MXFP8_E4M3, MXFP8_E4M3_RCEIL, fake_quantize,
                                         snr_db)
from mpcourse.numbers.formats import FP4_E2M1
from mpcourse.lowbit.saturation import clipped_share
from mpcourse.amp.update_walk import walk

from mpcourse.grading.judging.exercise import BEGIN_SOLUTION, END_SOLUTION, without_markers
from mpcourse.grading.judging.release import STUB

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
EX01, EX06, EX10, EX11 = ("ex01_bf16_rounding", "ex06_mixed_precision_step", "ex10_mx_scaling",
                          "ex11_stochastic_rounding")

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


EX10_FP4 = "PREDICTION_BACK_FLOOR"          # a word only the first prediction cell's stub holds
EX10_ACTIVATIONS = "PREDICTION_SNR_GAP_DB"
EX10_RIGHT = {EX10_FP4: ("PREDICTION_X_FLOOR = 2.0\nPREDICTION_X_ROUND_UP = 4\n"
                         "PREDICTION_BACK_FLOOR = [12, 1.0]\nPREDICTION_BACK_ROUND_UP = [12.0, 0]"),
              EX10_ACTIVATIONS: ("PREDICTION_CLIPPED_PERCENT = 13\nPREDICTION_LOWER_SNR_RULE = 'floor'\n"
                                 "PREDICTION_SNR_GAP_DB = 5.5")}  # near enough: within 1.5 points and 1.5 dB
# every number far from the truth, and the rule the other way round
EX10_WRONG = {EX10_FP4: ("PREDICTION_X_FLOOR = 99.0\nPREDICTION_X_ROUND_UP = 99.0\n"
                         "PREDICTION_BACK_FLOOR = [99.0, 99.0]\nPREDICTION_BACK_ROUND_UP = [99.0, 99.0]"),
              EX10_ACTIVATIONS: ("PREDICTION_CLIPPED_PERCENT = 99.0\nPREDICTION_LOWER_SNR_RULE = 'round-up'\n"
                                 "PREDICTION_SNR_GAP_DB = 99.0")}
# lesson 10's own numbers (its GPT's activations), which these activations do not repeat
EX10_LESSONS_NUMBERS = {EX10_ACTIVATIONS: "PREDICTION_CLIPPED_PERCENT = 0.79\n"
                                          "PREDICTION_LOWER_SNR_RULE = 'floor'\nPREDICTION_SNR_GAP_DB = 1.2"}
EX10_HOSTILE = {
    EX10_FP4: ("class Anything(list):\n    def __eq__(self, other):\n        return True\n"
               "class Sly(float):\n    def __eq__(self, other):\n        return True\n"
               "    __hash__ = float.__hash__\n"
               "PREDICTION_X_FLOOR = Sly(99.0)\nPREDICTION_X_ROUND_UP = torch.tensor(4.0)\n"
               "PREDICTION_BACK_FLOOR = Anything([99.0, 99.0])\n"
               "PREDICTION_BACK_ROUND_UP = Anything([99.0, 99.0])"),
    EX10_ACTIVATIONS: ("class Near(float):\n    def __sub__(self, other):\n        return 0.0\n"
                       "    def __rsub__(self, other):\n        return 0.0\n"
                       "class Same(str):\n    def __eq__(self, other):\n        return True\n"
                       "    __hash__ = str.__hash__\n"
                       "PREDICTION_CLIPPED_PERCENT = Near(99.0)\n"
                       "PREDICTION_LOWER_SNR_RULE = Same('round-up')\n"
                       "PREDICTION_SNR_GAP_DB = Near(99.0)")}
EX10_PREDICTIONS = ("predict_fp4_scales", "predict_fp4_values", "predict_clipped_share", "predict_snr_gap")
EX11_WRONG = {"PREDICTION_SPREAD_IN_GAPS": "PREDICTION_SPREAD_IN_GAPS = 99.0",
              "PREDICTION_BIAS_IN_GAPS": "PREDICTION_BIAS_IN_GAPS = 99.0"}
EX11_PREDICTIONS = ("predict_spread", "predict_bias_8_bits")


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


def submissions(folder: Path) -> list[Path]:
    """The right, wrong and hostile submissions, written into `folder`; tests/exercise_run.py grades them."""
    variants = _ex06_variants()
    return [
        _submission(folder, EX01, "right_predictions", EX01_RIGHT),
        _submission(folder, EX01, "wrong_predictions", EX01_WRONG),
        _submission(folder, EX01, "hostile_predictions", EX01_HOSTILE, extra=EX01_OVERWRITES_TRUTH),
        _submission(folder, EX06, "no_division", dict(EX06_RIGHT, accumulation_step=variants["no_division"])),
        _submission(folder, EX06, "scaler_per_micro_batch",
                    dict(EX06_HOSTILE, accumulation_step=variants["scaler_per_micro_batch"])),
        _submission(folder, EX06, "one_backward", {"accumulation_step": variants["one_backward"]}),
        _submission(folder, EX10, "right_predictions", EX10_RIGHT),
        _submission(folder, EX10, "wrong_predictions", EX10_WRONG),
        _submission(folder, EX10, "lessons_numbers", EX10_LESSONS_NUMBERS),
        _submission(folder, EX10, "hostile_predictions", EX10_HOSTILE),
        _submission(folder, EX11, "wrong_predictions", EX11_WRONG),
    ]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return {Path(path).stem: {t["id"]: t for t in s["tests"]}
            for path, s in graded_exercises(tmp_path_factory, "test_exercise_predictions").items()}


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


def test_ex10_right_predictions_earn_their_points_and_nothing_else(graded):
    tests = graded[f"{EX10}_right_predictions"]
    assert {t for t, result in tests.items() if result["passed"]} == set(EX10_PREDICTIONS), tests


def test_ex10_wrong_or_hostile_predictions_fail(graded):
    for name in ("wrong_predictions", "hostile_predictions"):
        tests = graded[f"{EX10}_{name}"]
        assert not any(tests[t]["passed"] for t in EX10_PREDICTIONS), (name, tests)


def test_ex10_lesson_10s_numbers_do_not_answer_the_new_activations(graded):
    tests = graded[f"{EX10}_lessons_numbers"]
    assert not tests["predict_clipped_share"]["passed"] and not tests["predict_snr_gap"]["passed"], tests
    clipped = tests["predict_clipped_share"]["reason"]
    assert "you predicted that the floor rule clips 0.79% of the values" in clipped
    assert "you predicted a gap of 1.2 dB" in tests["predict_snr_gap"]["reason"]


def _ex10_answers() -> dict:
    """Every quantity ex10's predictions ask for, computed with the course's library: the values
    the solution writes and the measured ones."""
    fp4 = torch.full((1, 32), 2.0)
    fp4[0, :2] = torch.tensor([13.0, 0.9])
    amax = fp4.abs().amax(dim=1)
    activations = torch.rand(256, 256, generator=torch.Generator().manual_seed(10)) * 2 - 1
    gap = snr_db(activations, MXFP8_E4M3_RCEIL) - snr_db(activations, MXFP8_E4M3)
    clipping, rounding = (1 / 8) * 0.125**2 / 3, (1 / 3) / 10 ** 3.2
    scales = [blockscale.mx_scale(amax, FP4_E2M1, rule).item() for rule in ("mx_floor", "mx_rceil")]
    values = [v for recipe in (MXFP4, MXFP4_RCEIL) for v in fake_quantize(fp4, recipe)[0, :2].tolist()]
    return {"predict_fp4_scales": scales,
            "predict_fp4_values": values,
            "predict_clipped_share": [100 * clipped_share(activations, MXFP8_E4M3), 12.5],
            "predict_snr_gap": [gap, 10 * math.log10((clipping + rounding) / rounding), "floor"]}


def _ex11_answers() -> dict:
    finals = walk(1.0, 2**-10, 448, "stochastic", n=20_000, record_every=448,
                  generator=torch.Generator().manual_seed(11))[-1]
    return {"predict_spread": [finals.std().item() / 2**-7, 7.0], "predict_bias_8_bits": [-1 / 512]}


def _renderings(answer) -> set[str]:
    """The ways a message or a test's code could show `answer`: a word as itself; a number as
    Python prints it, with 1 to 4 decimals or 3 to 4 significant digits, signed or not (never as
    a bare integer: '7' is in every '2**-7'), and -1/512 as the fraction."""
    if isinstance(answer, str):
        return {answer}
    forms = set()
    for value in {answer, abs(answer)}:
        forms |= {repr(float(value)), f"{value:.3g}", f"{value:.4g}"}
        forms |= {f"{value:.{decimals}f}" for decimals in (2, 3, 4)}
        if abs(value) >= 0.1:
            forms.add(f"{value:.1f}")
    if answer == -1 / 512:
        forms |= {"1/512", "1 / 512"}
    return {form for form in forms if "." in form or "/" in form} - {
        "0.00", "0.000", "0.0000", "-0.00", "-0.000", "-0.0000", "0.0020", "-0.0020"}


def _shows(text: str, form: str) -> bool:
    """Whether `form` stands in `text` as a whole number or word, not as part of a longer one."""
    return re.search(r"(?<![\w.])" + re.escape(form) + r"(?![\w])(?!\.\d)", text) is not None


@pytest.mark.parametrize("exercise", [EX10, EX11])
def test_no_visible_prediction_test_prints_or_holds_its_answer(graded, exercise):
    answers = _ex10_answers() if exercise == EX10 else _ex11_answers()
    tests = graded[f"{exercise}_wrong_predictions"]
    released = nbformat.read(ROOT / "exercises" / f"{exercise}.ipynb", as_version=4)
    sources = {c.metadata["nbgrader"]["grade_id"]: c.source for c in released.cells
               if c.cell_type == "code" and "nbgrader" in c.metadata}
    for test, values in answers.items():
        assert not tests[test]["passed"], tests[test]
        reason = tests[test]["reason"]
        for value in values:
            shown = [form for form in _renderings(value) if _shows(reason, form)]
            assert not shown, f"{exercise} {test}: a wrong prediction is told the answer {shown}: {reason}"
            # the FP4 tests' own block holds 2.0 and 13.0; the rule's test names both rules
            if test not in ("predict_fp4_scales", "predict_fp4_values") and not isinstance(value, str):
                held = [form for form in _renderings(value) if _shows(sources[test], form)]
                assert not held, f"{exercise} {test}: the visible test's code holds the answer {held}"
