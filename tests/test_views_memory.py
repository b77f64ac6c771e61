"""mpcourse.views.memory: lesson 02's stacked bars of the precision layouts."""
import matplotlib
import pytest

from mpcourse.memory import compare_layouts
from mpcourse.views.memory import plot_layouts

matplotlib.use("Agg")
M = 10**6


def test_chart_stacks_each_layouts_components():
    breakdowns = compare_layouts(10 * M, 20 * M)
    ax = plot_layouts(breakdowns, highlight="amp")
    tops = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0), bar.get_y() + bar.get_height())
    assert [tops[i] for i in range(3)] == pytest.approx([240, 200, 200])
    assert "MB" in ax.get_ylabel()
