"""mpcourse.views.memory: lesson 02's stacked bars of the precision layouts and its picture of
one measured step."""
import matplotlib
import pytest
import torch
import torch.nn as nn

from mpcourse.memory.accounting import MB, compare_layouts
from mpcourse.memory.measure import PeakMemory, measure_peak_memory
from mpcourse.views.memory import plot_layouts, plot_step_memory

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU accounting path")
def test_step_picture_stacks_the_measured_kinds_and_marks_the_peak():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(128, 32)

    def step():
        model(x).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    peak = measure_peak_memory(step, model=model, optimizer=optimizer)
    ax = plot_step_memory(peak)
    stacks = ax.collections   # one filled band per kind, bottom to top
    assert len(stacks) == 4
    top = stacks[-1].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(peak.peak / MB)
    (marked,) = [line.get_xdata()[0] for line in ax.lines]   # the moment the measurement peaked
    assert sum(peak.timeline[marked].values()) == peak.peak
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [label.split(" (")[0] for label in labels] == [   # top to bottom, as stacked
        "saved for backward", "gradients", "optimizer state", "parameters"]
    assert labels[1] == f"gradients (at most {peak.largest['gradients'] / MB:,.1f} MB)"


def test_step_picture_refuses_a_measurement_without_a_timeline():
    with pytest.raises(ValueError, match="timeline"):
        plot_step_memory(PeakMemory("cuda", 10, {"allocated before the call": 10}))
