"""mpcourse.views.optimizers: lesson 11's pictures draw the numbers they are given."""
import matplotlib
import pytest
import torch

from mpcourse.optim.kahan import compensated_add
from mpcourse.train.variants.ladder_measure import SeedInterval, seed_interval
from mpcourse.views.optimizers import plot_kahan_split, plot_ladder, plot_rung_memory

matplotlib.use("Agg")


def test_kahan_split_draws_the_weight_the_sum_and_the_compensation_in_gaps():
    weight, compensation = torch.ones(1, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.bfloat16)
    weights, compensations = [1.0], [0.0]
    for _ in range(20):
        weight, compensation = compensated_add(weight, compensation, torch.tensor([1e-3]))
        weights.append(weight.item())
        compensations.append(compensation.item())
    exact = [1 + i * 1e-3 for i in range(21)]
    fig = plot_kahan_split(weights, compensations, exact, 2**-7)
    top, bottom = fig.axes
    lines = {line.get_label(): list(line.get_ydata()) for line in top.get_lines()}
    assert lines["stored BF16 weight"] == weights and lines["exact sum (float64)"] == exact
    assert lines["weight + compensation"] == pytest.approx([w + c for w, c in zip(weights, compensations)])
    assert list(bottom.get_lines()[0].get_ydata()) == pytest.approx([c / 2**-7 for c in compensations])


def test_step_memory_bars_are_the_measurements():
    labels, kept, one, every = ["a", "b"], [16, 8], [18, 13.7], [18, 19.8]
    fig = plot_rung_memory(labels, kept, one, every, predicted=[18.1, 19.7])
    widths = sorted(round(bar.get_width(), 6) for bar in fig.axes[0].patches)
    assert widths == sorted(kept + one + every)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == labels


def test_ladder_draws_one_dot_per_seed_and_each_mean_with_its_interval():
    gaps = [[0.0, 0.0, 0.0], [-0.004, 0.003, 0.001], [0.21, 0.2, 0.23]]
    intervals = [seed_interval(g) if any(g) else SeedInterval(0.0, 0.0, 0.0, 0.0, 3) for g in gaps]
    fig = plot_ladder(["fp32", "sr", "none"], [16, 8, 8], gaps, intervals)
    ax = fig.axes[0]
    dots = sorted(y for collection in ax.collections if len(collection.get_offsets()) == 3
                  for _, y in collection.get_offsets())
    assert dots == pytest.approx(sorted(g for seeds in gaps for g in seeds))
    bars = [c for c in ax.containers]  # errorbar containers: one per rung
    assert len(bars) == 3
    for bar, interval in zip(bars, intervals):
        (_, y), = bar.lines[0].get_xydata()
        assert y == pytest.approx(interval.mean)
        if interval.spread:
            segment = bar.lines[2][0].get_segments()[0]
            assert sorted(p[1] for p in segment) == pytest.approx([interval.low, interval.high])
