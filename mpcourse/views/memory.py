"""Lesson 02's pictures: the memory of each precision layout as a stacked bar, one segment per
kind of tensor, and the memory of one measured training step, event by event."""
from __future__ import annotations

from mpcourse.memory.accounting import MB, MemoryBreakdown

# One colour per kind of tensor, the same in every picture of this module.
KIND_COLOURS = {"parameters": "C0", "master parameters": "C1", "activations": "C2",
                "gradients": "C3", "optimizer state": "C4", "16-bit weight copies": "C5"}
# The names `memory_measure.PeakMemory` gives the kinds, mapped to the names above.
_MEASURED_KINDS = {"parameters": "parameters", "optimizer state": "optimizer state",
                   "gradients": "gradients", "saved for backward": "activations"}


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
        ax.bar(names, heights, bottom=bottoms, label=component, color=KIND_COLOURS[component])
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


def plot_step_memory(peak, ax=None):
    """The memory of one step measured on a CPU (`memory_measure.measure_peak_memory`), stacked
    by kind after every event it watched, with the peak marked; returns the Axes.

    It shows what one number cannot: the saved tensors climb through forward and fall through
    backward while the gradients appear, so the kinds never reach their largest together.
    """
    import matplotlib.pyplot as plt

    if not peak.timeline:
        raise ValueError(f"plot_step_memory needs the timeline of a CPU measurement; this "
                         f"PeakMemory on {peak.device!r} has none")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    events = range(len(peak.timeline))
    kinds = list(_MEASURED_KINDS)
    ax.stackplot(events, [[moment[kind] / MB for moment in peak.timeline] for kind in kinds],
                 labels=[f"{kind} (at most {peak.largest.get(kind, peak.parts[kind]) / MB:,.1f} MB)"
                         for kind in kinds],
                 colors=[KIND_COLOURS[_MEASURED_KINDS[kind]] for kind in kinds])
    at_peak = max(events, key=lambda i: sum(peak.timeline[i].values()))
    ax.axvline(at_peak, color="black", linestyle=":")
    ax.annotate(f"peak {peak.mb:,.1f} MB", (at_peak, peak.mb), xytext=(6, 4),
                textcoords="offset points")
    ax.set_xlabel("events in the call (a tensor saved or freed, a gradient accumulated, a step)")
    ax.set_ylabel("memory (decimal MB)")
    ax.set_ylim(0, peak.mb * 1.15)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.0, 1.0))  # as stacked
    return ax
