"""ex11's two predict-then-measure questions, graded on right, wrong and hostile submissions built
from the released exercise, the way tests/test_exercise_predictions.py grades ex01's; and the
reference of the 8-bit question, the course's library, checked against a count made with integers.
"""
from fractions import Fraction
from pathlib import Path

import nbformat
import pytest
import torch
from exercise_run import graded_exercises

from mpcourse.numbers.formats import BF16
from mpcourse.grading.judging.release import STUB
from mpcourse.optim.stochastic import stochastic_round

ROOT = Path(__file__).resolve().parents[1]
EX11 = "ex11_stochastic_rounding"
GAP = 2**-7
UPDATE = 3 * 2**-16      # the 8-bit question's update: 3/512 of the gap above 1.0
HOSTILE_FLOAT = ("class Anything(float):\n    def __eq__(self, other):\n        return True\n"
                 "    def __truediv__(self, other):\n        return 1.0\n"
                 "    def __sub__(self, other):\n        return 0.0\n"
                 "    __hash__ = float.__hash__\n")
RIGHT_BIAS = "PREDICTION_BIAS_IN_GAPS = -1 / 512"
SUBMISSIONS = {
    "right": ("PREDICTION_SPREAD_IN_GAPS = 7", RIGHT_BIAS),
    # 7.48: within 10%
    "sqrt_g_d": ("PREDICTION_SPREAD_IN_GAPS = (2**-7 * 448 * 2**-10) ** 0.5 / 2**-7", RIGHT_BIAS),
    # the variance, not its root; and the 8 bits read as the low 8 of the 16: every draw rounds down
    "wrong": ("PREDICTION_SPREAD_IN_GAPS = 448 / 8", "PREDICTION_BIAS_IN_GAPS = -3 / 512"),
    "unbiased": ("PREDICTION_SPREAD_IN_GAPS = 7", "PREDICTION_BIAS_IN_GAPS = 0"),
    "hostile": (HOSTILE_FLOAT + "PREDICTION_SPREAD_IN_GAPS = Anything(100.0)",
                HOSTILE_FLOAT + "PREDICTION_BIAS_IN_GAPS = Anything(0.5)"),
}
PREDICTIONS = {"predict_spread", "predict_bias_8_bits"}


def library_bias_in_gaps(update: float, shift: int = 8) -> float:
    """The bias of 1 + update stored with 8 random bits placed `shift` bits up, in gaps: the
    course's stochastic rounding over all 256 draws, each once (the exact expectation)."""
    updated = torch.full((256,), 1.0 + update)
    stored = stochastic_round(updated, BF16, random_bits=torch.arange(256, dtype=torch.int32) << shift)
    return (stored.double().mean().item() - updated[0].item()) / GAP


def counted_bias_in_gaps(update: float, shift: int = 8) -> Fraction:
    """The same bias from the definition, with no float rounding: the dropped part D of the gap as
    an integer out of 2**16, and the draws r whose bits, added to D, reach a whole gap."""
    dropped = Fraction(update) / Fraction(GAP) * 2**16
    assert dropped.denominator == 1, "the update must be a whole number of 2**-16 gaps"
    ups = sum(1 for r in range(256) if (r << shift) + dropped >= 2**16)
    return Fraction(ups, 256) - dropped / 2**16


@pytest.mark.parametrize("dropped", [1, 255, 256, 384, 1000, 65280, 65535])
@pytest.mark.parametrize("shift", [8, 0])
def test_the_8_bit_reference_agrees_with_a_count_from_the_definition(dropped, shift):
    update = dropped * 2**-16 * GAP
    assert library_bias_in_gaps(update, shift) == float(counted_bias_in_gaps(update, shift))


def test_the_solutions_8_bit_answer_is_the_true_bias():
    assert counted_bias_in_gaps(UPDATE) == Fraction(-1, 512)
    assert library_bias_in_gaps(UPDATE) == -1 / 512
    assert counted_bias_in_gaps(UPDATE, shift=0) == Fraction(-3, 512)  # the low 8 bits: the update is lost


def _submission(folder: Path, name: str, answers: tuple[str, str]) -> Path:
    nb = nbformat.read(ROOT / "exercises" / f"{EX11}.ipynb", as_version=4)
    for variable, answer in zip(("PREDICTION_SPREAD_IN_GAPS", "PREDICTION_BIAS_IN_GAPS"), answers):
        cells = [c for c in nb.cells
                 if c.cell_type == "code" and STUB[1] in c.source and variable in c.source]
        assert len(cells) == 1, f"the released exercise has one stubbed cell for {variable}"
        cells[0].source = answer
    path = folder / f"{EX11}_{name}.ipynb"
    nbformat.write(nb, path)
    return path


def submissions(folder: Path) -> list[Path]:
    """SUBMISSIONS written into `folder`; tests/exercise_run.py grades them."""
    return [_submission(folder, name, answers) for name, answers in SUBMISSIONS.items()]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return {Path(path).stem.removeprefix(EX11 + "_"): {t["id"]: t for t in s["tests"]}
            for path, s in graded_exercises(tmp_path_factory, "test_ex11_prediction").items()}


@pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)
def test_the_right_answers_and_the_sqrt_g_d_approximation_pass(graded):
    for name in ("right", "sqrt_g_d"):
        passed = {t for t, result in graded[name].items() if result["passed"]}
        assert passed == PREDICTIONS, graded[name]  # the rounding itself is still a stub


@pytest.mark.sandbox
def test_a_wrong_prediction_fails_with_a_hint_and_without_the_answer(graded):
    spread = graded["wrong"]["predict_spread"]
    assert not spread["passed"]
    assert "you predicted 56.0 gaps" in spread["reason"] and "standard deviation" in spread["reason"]
    bias = graded["wrong"]["predict_bias_8_bits"]
    assert not bias["passed"]
    assert "you predicted a bias of -0.005859375 gaps" in bias["reason"]
    assert "which values of r" in bias["reason"]
    # what is printed is the learner's own number and a question, never the answer
    # (tests/test_exercise_predictions.py checks every prediction test of ex10 and ex11 for that)


@pytest.mark.sandbox
def test_no_bias_is_the_16_bit_answer_and_fails_here(graded):
    assert graded["unbiased"]["predict_spread"]["passed"]
    assert not graded["unbiased"]["predict_bias_8_bits"]["passed"]


@pytest.mark.sandbox
def test_a_float_that_compares_or_divides_to_anything_does_not_pass(graded):
    for test in PREDICTIONS:
        assert not graded["hostile"][test]["passed"], graded["hostile"][test]
