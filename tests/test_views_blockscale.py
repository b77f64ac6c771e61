"""Lesson 10's pictures draw what they are given: landing points, block labels, error curves."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mpcourse.views.blockscale import plot_amax_landings, plot_error_against_k, plot_three_matmuls  # noqa: E402


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
