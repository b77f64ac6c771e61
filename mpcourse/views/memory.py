"""Lesson 02's picture: the memory of each precision layout as a stacked bar, one segment per
kind of tensor (parameters, master copy, activations, gradients, optimizer state)."""
from __future__ import annotations

from mpcourse.memory import MB, MemoryBreakdown


def plot_layouts(breakdowns: dict[str, MemoryBreakdown], highlight: str | None = None, ax=None):
    """A stacked bar per layout, one segment per component, in decimal MB; returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    names = list(breakdowns)
    components = list(dict.fromkeys(c for b in breakdowns.values() for c in b.components()))
    bottoms = [0.0] * len(names)
    for component in components:
        heights = [breakdowns[n].components().get(component, 0) / MB for n in names]
        ax.bar(names, heights, bottom=bottoms, label=component)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, name in enumerate(names):
        weight = "bold" if name == highlight else "normal"
        ax.text(i, bottoms[i], f"{breakdowns[name].mb:,.1f} MB", ha="center", va="bottom",
                fontweight=weight)
    ax.set_ylabel("memory (decimal MB)")
    ax.set_xlabel("precision layout")
    ax.set_ylim(0, max(bottoms) * 1.15 or 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax
