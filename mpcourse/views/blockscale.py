"""Lesson 10's pictures: where a block's amax lands under each scale rule, the three matmuls
of a linear layer with their block shapes, an accumulator's error against K, each recipe's
gap to FP32 as paired dots per seed, and quantization's cost against a matmul's saving.

Each takes values already computed (a grid, landing points, error curves) and draws them.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from mpcourse.views.diagrams import DTYPE_COLOURS, OTHER_COLOUR

RULE_COLOURS = {"floor (OCP MX)": "#D55E00", "round-up (RCEIL)": "#0072B2",
                "E4M3 scale (NVFP4)": "#009E73"}


def plot_amax_landings(grids: dict[str, list[float]], landings: dict[str, dict[str, float]]) -> Figure:
    """One number line per element format (log scale): its positive values as ticks, the
    clipping zone above element.max (the grid's largest value) shaded, and where amax / X
    lands under each rule."""
    fig, axes = plt.subplots(len(grids), 1, figsize=(10, 1.9 * len(grids)), squeeze=False)
    axes = axes[:, 0]
    for ax, (name, values) in zip(axes, grids.items()):
        positive = [v for v in values if v > 0]
        top = max(values)
        right = 2 * 2 ** int(top).bit_length()  # past the largest value, by a power of two
        ax.vlines(positive, 0, 1, color=OTHER_COLOUR, lw=0.8)
        ax.axvspan(top, right, color="#D55E00", alpha=0.12)
        ax.text(top / 1.04, 1.25, f"clips to {top:g} ->", color="#D55E00", fontsize=8, ha="right")
        for i, (rule, where) in enumerate(landings[name].items()):
            ax.plot([where], [0.5], marker="v^o"[i % 3], ms=10, color=RULE_COLOURS.get(rule, "k"),
                    ls="", label=f"{rule}: {where:.4g}")
        ax.set_xscale("log", base=2)
        ax.set_xlim(min(positive) / 1.5, right)
        ax.set_ylim(0, 1.6)
        ax.set_yticks([])
        ax.set_title(f"{name}: where the block's amax / X lands", fontsize=10, loc="left")
        ax.legend(loc="upper left", fontsize=8, ncol=3, frameon=False, bbox_to_anchor=(0, 0.98))
    axes[-1].set_xlabel("value on the element grid (log scale; grey ticks: the representable values)")
    fig.tight_layout()
    return fig


def plot_three_matmuls(blocks: dict[str, dict[str, tuple[str, str]]]) -> Figure:
    """The forward, input-gradient and weight-gradient matmuls of a linear layer as three
    panels: each operand a box labelled with its shape and its scale blocks; the dimension the
    matmul sums over (K) marked in each. `blocks[matmul][operand] = (shape, block label)`."""
    fig, axes = plt.subplots(1, len(blocks), figsize=(4.2 * len(blocks), 3.0), squeeze=False)
    for ax, (title, operands) in zip(axes[0], blocks.items()):
        x = 0.02
        for i, (operand, (shape, block)) in enumerate(operands.items()):
            colour = DTYPE_COLOURS["fp8_e4m3"] if i < 2 else DTYPE_COLOURS["fp32"]
            ax.add_patch(Rectangle((x, 0.3), 0.27, 0.4, fc=colour, alpha=0.25, ec=colour))
            ax.text(x + 0.135, 0.57, operand, ha="center", fontsize=10, weight="bold")
            ax.text(x + 0.135, 0.45, shape, ha="center", fontsize=8)
            ax.text(x + 0.135, 0.2, block, ha="center", fontsize=8, color="#333333")
            if i < 2:
                ax.text(x + 0.3, 0.5, "@" if i == 0 else "=", ha="center", fontsize=12)
            x += 0.33
        ax.set_title(title, fontsize=10)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.axis("off")
    fig.suptitle("A linear layer's three matmuls: each operand blocked along the dimension "
                 "its matmul sums over (K)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_error_against_k(curves: dict[str, dict[int, float]]) -> Figure:
    """Each accumulator's largest relative error against the dot product's length K (log-log),
    with lines of slope 1 (errors that add up) and 1/2 (errors that cancel) for reference."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, errors in curves.items():
        ks = sorted(errors)
        ax.plot(ks, [100 * errors[k] for k in ks], marker="o", label=name)
    first = min(min(c) for c in curves.values())
    last = max(max(c) for c in curves.values())
    anchor = 100 * max(c[first] for c in curves.values())
    ax.plot([first, last], [anchor, anchor * last / first], ls=":", color="gray", label="grows like K")
    ax.plot([first, last], [anchor, anchor * (last / first) ** 0.5], ls="--", color="gray",
            label="grows like sqrt(K)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("K, the number of products summed")
    ax.set_ylabel("largest error (% of the largest output)")
    ax.set_title("A narrow accumulator's error against K")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_paired_gaps(gaps: dict[str, dict[int, float]], ax=None, title: str = "") -> Figure:
    """One column per recipe: its gap to FP32 for each seed as a dot (the same colour for the
    same seed in every column, so pairs can be followed), the mean as a bar, and mean +- one
    standard deviation over the seeds as a band. No lines join the seeds: they are not a
    series."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    seeds = sorted({seed for per_seed in gaps.values() for seed in per_seed})
    colours = plt.get_cmap("tab10")
    for i, (name, per_seed) in enumerate(gaps.items()):
        values = [per_seed[s] for s in seeds]
        mean = sum(values) / len(values)
        spread = (sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)) ** 0.5
        ax.add_patch(Rectangle((i - 0.3, mean - spread), 0.6, 2 * spread, color="#999999", alpha=0.25, lw=0))
        ax.hlines(mean, i - 0.3, i + 0.3, color="black", lw=1.5)
        for j, (seed, value) in enumerate(zip(seeds, values)):
            ax.plot(i - 0.15 + 0.3 * j / max(len(seeds) - 1, 1), value, "o", color=colours(j),
                    label=f"seed {seed}" if i == 0 else None)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xticks(range(len(gaps)), list(gaps), rotation=20)
    ax.set_xlim(-0.6, len(gaps) - 0.4)
    ax.set_ylabel("held-out loss minus FP32's (nats/token)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return ax.figure


def plot_cost_against_saving(shares: dict[str, dict[str, float]], saving_label: str = "") -> Figure:
    """Grouped bars: for each counting assumption (outer key), each layout's quantization time
    as a share of what the faster matmul saves (inner key: layout), with the break-even at 1."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    layouts = list(next(iter(shares.values())))
    width = 0.8 / len(layouts)
    for j, layout_name in enumerate(layouts):
        ax.bar([i + (j - (len(layouts) - 1) / 2) * width for i in range(len(shares))],
               [100 * per_layout[layout_name] for per_layout in shares.values()], width, label=layout_name)
    ax.axhline(100, color="#D55E00", ls="--", lw=1, label="the whole saving" + saving_label)
    ax.set_xticks(range(len(shares)), list(shares))
    ax.set_ylabel("quantization time, % of the matmul's saving")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig
