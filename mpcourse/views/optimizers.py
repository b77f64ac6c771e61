"""Pictures of lesson 11: the Kahan split, a step's memory per rung, and the ladder's cost and loss.

Views only draw results computed elsewhere (`mpcourse.optim.kahan`, `mpcourse.train.variants.ladder_measure`,
`mpcourse.train`); each returns its figure.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt

from mpcourse.train.variants.ladder_measure import SeedInterval


def plot_kahan_split(weights: Sequence[float], compensations: Sequence[float],
                     exact: Sequence[float], gap: float):
    """One BF16 weight and its BF16 compensation, step by step, against the exact sum.

    Top: the stored weight (a staircase of whole gaps), weight + compensation, and the exact
    sum. Bottom: the compensation, in units of the weight's gap: it gathers each update until
    half a gap is reached, then the weight takes a whole gap and the compensation turns negative.
    """
    steps = range(len(weights))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    top.plot(steps, exact, color="black", lw=1, label="exact sum (float64)")
    top.step(steps, weights, where="post", color="tab:red", label="stored BF16 weight")
    top.plot(steps, [w + c for w, c in zip(weights, compensations)], color="tab:green", ls="--",
             label="weight + compensation")
    top.set_ylabel("value")
    top.legend(fontsize="small", loc="upper left")
    bottom.step(steps, [c / gap for c in compensations], where="post", color="tab:green")
    for level in (-0.5, 0.5):
        bottom.axhline(level, color="gray", lw=0.8, ls=":")
    bottom.axhline(0, color="gray", lw=0.8)
    bottom.set_ylabel("compensation\n(gaps of the weight)")
    bottom.set_xlabel("update number")
    top.set_title("Kahan: the weight takes whole gaps, the compensation keeps the rest")
    fig.tight_layout()
    return fig


def plot_rung_memory(labels: Sequence[str], kept: Sequence[float], per_tensor: Sequence[float],
                     all_at_once: Sequence[float], predicted: Sequence[float]):
    """Bytes per parameter of each rung: kept between steps, and the measured peak of `step()`
    one tensor at a time and all at once; a tick marks each prediction."""
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 2.2))
    rows = range(len(labels))
    ax.barh([r + 0.27 for r in rows], all_at_once, height=0.27, color="tab:red", alpha=0.5,
            label="peak of step(), all tensors at once")
    ax.barh(rows, per_tensor, height=0.27, color="tab:orange", alpha=0.8,
            label="peak of step(), one tensor at a time")
    ax.barh([r - 0.27 for r in rows], kept, height=0.27, color="tab:blue",
            label="kept between steps")
    ax.scatter(predicted, [r + 0.27 for r in rows], marker="|", s=120, color="black",
               label="predicted peak, all at once")
    ax.axvline(kept[0], color="gray", lw=0.8, ls=":")
    ax.annotate(f"{labels[0]}: {kept[0]:.0f} kept", (kept[0], -0.6), fontsize="x-small",
                color="gray", ha="center")
    ax.set_yticks(list(rows), labels, fontsize="small")
    ax.set_ylim(len(labels) - 0.5, -0.8)
    ax.set_xlabel("bytes per parameter (the lesson's GPT)")
    ax.set_title("What each rung keeps, and the peak of its optimizer step")
    fig.legend(fontsize="small", loc="lower center", ncol=2)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def plot_ladder(labels: Sequence[str], bytes_per_parameter: Sequence[float],
                gaps: Sequence[Sequence[float]], intervals: Sequence[SeedInterval]):
    """Final loss minus FP32's (same seed) against bytes kept per parameter: one dot per seed, and
    beside them each rung's mean with its 95% confidence interval (`ladder_measure.seed_interval`,
    the spread estimated from the seeds)."""
    fig, ax = plt.subplots(figsize=(8, 5.8))
    for i, (label, size, seeds, interval) in enumerate(zip(labels, bytes_per_parameter, gaps,
                                                           intervals)):
        x = size + 0.12 * (i % 3 - 1)
        ax.scatter([x] * len(seeds), seeds, color=f"C{i}", s=14, alpha=0.6, label=label)
        ax.errorbar([x + 0.05], [interval.mean], yerr=[[interval.mean - interval.low],
                    [interval.high - interval.mean]], color=f"C{i}", fmt="_", capsize=3, lw=1.5)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_yscale("symlog", linthresh=0.01)  # linear within +-0.01 nats, logarithmic beyond
    ax.set_xlabel("bytes per parameter kept between steps")
    ax.set_ylabel("final loss minus FP32's, same seed (nats)")
    ax.set_title("What each rung costs and loses: dots per seed, mean with its 95% interval")
    fig.legend(fontsize="x-small", ncol=3, loc="lower center")
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    return fig
