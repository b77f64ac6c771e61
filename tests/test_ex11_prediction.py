"""ex11's predict-then-measure question, graded on right, wrong and hostile submissions built from
the released exercise, the way tests/test_exercise_predictions.py grades ex01's."""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from mpcourse.grading.release import STUB

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
EX11 = "ex11_stochastic_rounding"
ANSWERS = {
    "right": "PREDICTION_SPREAD_IN_GAPS = 7",
    "sqrt_g_d": "PREDICTION_SPREAD_IN_GAPS = (2**-7 * 448 * 2**-10) ** 0.5 / 2**-7",  # 7.48: within 10%
    "no_one_minus_p": "PREDICTION_SPREAD_IN_GAPS = 448 / 8",                            # the variance, not its root
    "hostile": ("class Anything(float):\n    def __eq__(self, other):\n        return True\n"
                "    def __truediv__(self, other):\n        return 1.0\n"
                "    __hash__ = float.__hash__\nPREDICTION_SPREAD_IN_GAPS = Anything(100.0)"),
}


def _submission(folder: Path, name: str, answer: str) -> Path:
    nb = nbformat.read(ROOT / "exercises" / f"{EX11}.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and STUB[1] in c.source
             and "PREDICTION_SPREAD_IN_GAPS" in c.source]
    assert len(cells) == 1, "the released exercise has one stubbed prediction cell"
    cells[0].source = answer
    path = folder / f"{EX11}_{name}.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ex11")
    paths = [_submission(folder, name, answer) for name, answer in ANSWERS.items()]
    result = subprocess.run([sys.executable, "-m", "mpcourse.cli", "grade", *map(str, paths), "--json",
                             "--timeout", "300", "--jobs", "2", "--solutions", str(ROOT / "solutions")],
                            capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert result.returncode == 0, result.stderr
    return {Path(s["path"]).stem.removeprefix(EX11 + "_"): {t["id"]: t for t in s["tests"]}
            for s in json.loads(result.stdout)["submissions"]}


def test_the_binomial_answer_and_its_sqrt_g_d_approximation_pass(graded):
    for name in ("right", "sqrt_g_d"):
        passed = {t for t, result in graded[name].items() if result["passed"]}
        assert passed == {"predict_spread"}, graded[name]  # the rounding itself is still a stub


def test_a_wrong_prediction_fails_with_the_reasoning(graded):
    reason = graded["no_one_minus_p"]["predict_spread"]["reason"]
    assert not graded["no_one_minus_p"]["predict_spread"]["passed"]
    assert "you predicted 56.0 gaps" in reason and "sqrt(n p (1 - p))" in reason


def test_a_float_that_divides_to_anything_does_not_pass(graded):
    result = graded["hostile"]["predict_spread"]
    assert not result["passed"], result
