"""Views draw what runs measured: the curves, the floor and the differences come from results."""
import dataclasses
import math

import matplotlib
import pytest

matplotlib.use("Agg")

from mpcourse.train.data import MarkovText  # noqa: E402
from mpcourse.train import RunConfig, RunResult, build, train  # noqa: E402
from mpcourse.views.runs import (RunComparison, moving_average, plot_curves,  # noqa: E402
                                 plot_loss_differences, plot_losses)

TINY = RunConfig(d_model=16, n_layers=1, n_heads=2, vocab_size=32, batch_size=2, seq_len=8,
                 steps=6, warmup_steps=1, eval_batches=1, device="cpu")


def result(precision: str, losses: list[float], floor: float = 1.5) -> RunResult:
    return RunResult(dataclasses.replace(TINY, precision=precision, loss_scaling="off"), "cpu", True,
                     losses=losses, floor=floor)


def test_a_run_records_the_floor_of_its_own_data():
    run = train(TINY)
    assert run.floor == MarkovText(TINY.vocab_size, seed=TINY.seed).entropy_rate
    assert math.isfinite(run.floor) and run.floor < run.final_loss


def test_build_makes_the_run_that_train_trains():
    setup = build(TINY, TINY.resolved_device())
    again = build(TINY, TINY.resolved_device())
    for a, b in zip(setup.model.parameters(), again.model.parameters()):
        assert a.equal(b)   # seeded: the same model every time
    x, y = setup.batches.get(0)
    assert x.shape == (TINY.batch_size, TINY.seq_len) and setup.scaler.is_enabled()
    assert setup.parameters == list(setup.model.parameters())


def test_plot_losses_draws_each_run_averaged_and_the_floor_the_results_carry():
    runs = [result("fp32", [4.0, 3.0, 2.5, 2.0]), result("bf16", [4.0, 3.5, 2.0, 2.0])]
    axes = plot_losses(runs, smooth=2).axes[0]
    curves = [line for line in axes.lines if line.get_label() in ("fp32", "bf16")]
    assert [line.get_label() for line in curves] == ["fp32", "bf16"]
    steps, averaged = moving_average(runs[1].losses, 2)
    assert list(curves[1].get_ydata()) == averaged.tolist() == [3.75, 2.75, 2.0]
    assert list(curves[1].get_xdata()) == list(steps)
    floor = [line for line in axes.lines if "best possible" in line.get_label()]
    assert len(floor) == 1 and floor[0].get_ydata()[0] == 1.5


def test_no_floor_is_drawn_for_runs_on_different_data():
    axes = plot_losses([result("fp32", [2.0, 1.0], 1.5), result("bf16", [2.0, 1.0], 1.2)]).axes[0]
    assert not [line for line in axes.lines if "best possible" in line.get_label()]
    axes = plot_curves([("live", [3.0, 2.0])]).axes[0]
    assert [line.get_label() for line in axes.lines] == ["live"]


def test_loss_differences_subtract_the_fp32_run_step_by_step():
    fp32, bf16 = result("fp32", [4.0, 3.0, 2.0]), result("bf16", [4.5, 2.5, 2.25])
    axes = plot_loss_differences([fp32, bf16]).axes[0]
    (curve,) = [line for line in axes.lines if line.get_label() == "bf16"]
    assert list(curve.get_ydata()) == [0.5, -0.5, 0.25]
    with pytest.raises(ValueError, match="no fp32 run"):
        plot_loss_differences([bf16])


def test_a_comparison_prints_its_table_and_plots_its_runs():
    comparison = RunComparison([result("fp32", [2.0, 1.0]), result("bf16", [2.0, 1.5])])
    assert str(comparison).splitlines()[0].startswith("run") and "bf16" in comparison.html()
    assert len(comparison.plot().axes[0].lines) == 3   # two runs and the floor
