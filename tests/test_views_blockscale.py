"""Lesson 10's pictures draw what they are given: landing points, block labels, error curves."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mpcourse.views.blockscale import (plot_amax_landings, plot_cost_against_saving,  # noqa: E402
                                       plot_error_against_k, plot_paired_gaps, plot_three_matmuls)


def test_amax_landings_mark_each_rule_where_it_lands():
    fig = plot_amax_landings({"fp4_e2m1": [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]},
                             {"fp4_e2m1": {"floor (OCP MX)": 7.0, "round-up (RCEIL)": 3.5}})
    ax = fig.axes[0]
    marks = {line.get_label().split(":")[0]: line.get_xdata()[0] for line in ax.lines}
    assert marks == {"floor (OCP MX)": 7.0, "round-up (RCEIL)": 3.5}
    assert ax.get_xscale() == "log" and ax.get_xlim()[0] < 0.5 < 7.0 < ax.get_xlim()[1]
    plt.close(fig)


def test_three_matmuls_label_every_operand_with_its_blocks():
    fig = plot_three_matmuls({"forward": {"x": ("t x in", "1 x 16"), "W.T": ("in x out", "16 x 16"),
                                          "y": ("t x out", "FP32")}})
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert {"x", "W.T", "y", "1 x 16", "16 x 16", "t x in"} <= set(texts)
    plt.close(fig)


def test_error_against_k_plots_each_curve_in_percent():
    curves = {"truncation": {128: 0.001, 4096: 0.02}, "nearest": {128: 0.0001, 4096: 0.0006}}
    fig = plot_error_against_k(curves)
    ax = fig.axes[0]
    drawn = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    assert drawn["truncation"] == pytest.approx([0.1, 2.0]) and drawn["nearest"] == pytest.approx([0.01, 0.06])
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    grows_like_k, grows_like_sqrt_k = drawn["grows like K"], drawn["grows like sqrt(K)"]
    assert grows_like_k[-1] / grows_like_k[0] == pytest.approx(4096 / 128)
    assert grows_like_sqrt_k[-1] / grows_like_sqrt_k[0] == pytest.approx((4096 / 128) ** 0.5)
    plt.close(fig)


def test_paired_gaps_draw_one_dot_per_seed_a_mean_and_a_band_and_no_lines_between_seeds():
    fig = plot_paired_gaps({"a": {0: 0.1, 1: 0.3}, "b": {0: -0.1, 1: 0.1}})
    ax = fig.axes[0]
    dots = [line for line in ax.lines if line.get_marker() == "o"]
    assert len(dots) == 4 and all(len(line.get_xdata()) == 1 for line in dots)
    assert sorted(round(line.get_ydata()[0], 6) for line in dots) == [-0.1, 0.1, 0.1, 0.3]
    band = ax.patches[0]
    assert abs(band.get_y() - (0.2 - 0.02 ** 0.5)) < 1e-9 and abs(band.get_height() - 2 * 0.02 ** 0.5) < 1e-9
    plt.close(fig)


def test_cost_bars_show_each_share_in_percent():
    fig = plot_cost_against_saving({"unfused": {"x": 0.5, "y": 0.25}, "fused": {"x": 0.1, "y": 0.2}})
    heights = sorted(round(p.get_height(), 6) for p in fig.axes[0].patches)
    assert heights == [10.0, 20.0, 25.0, 50.0]
    plt.close(fig)
