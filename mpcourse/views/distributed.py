"""Multi-process runs side by side (lesson 08): the results table, what each collective leaves on
each rank, and the bytes each run puts on the wire."""
from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from mpcourse.distributed.collectives import COLLECTIVES
from mpcourse.views.diagrams import DTYPE_COLOURS, blank_axes, dtype_colour, dtype_label

if TYPE_CHECKING:
    from mpcourse.distributed import DistributedResult

#: A grey per rank, for where each value came from (greys: the dtype colours keep their meaning).
RANK_TINTS = ("#d4d4d4", "#9a9a9a", "#bcbcbc", "#808080")
SUM_TINT = "#ffffff"
#: The hatching of each collective's part of a bar (its fill is the dtype it carries).
COLLECTIVE_HATCHES = {"all_reduce": "", "all_gather": "//", "reduce_scatter": ".."}


def format_results(results: list[DistributedResult]) -> str:
    """The runs as a plain-text table: final loss, bytes communicated and memory per rank."""
    header = (f"{'run':36}{'ranks':>6}{'final loss':>11}{'gradient B/step':>16}"
              f"{'other B/step':>13}{'params B/rank':>14}{'grads B/rank':>13}")
    lines = [header, "-" * len(header)]
    for r in results:
        other = sum(r.bytes_per_step.values()) - r.gradient_bytes_per_step
        lines.append(f"{r.run.label:36}{r.world_size:>6}{r.losses[-1]:>11.4f}{r.gradient_bytes_per_step:>16,}"
                     f"{other:>13,}{max(r.param_bytes):>14,}{max(r.grad_bytes):>13,}")
    return "\n".join(lines)


def collectives_picture(inputs: list[torch.Tensor], results: dict[str, list[torch.Tensor]]) -> Figure:
    """What each rank holds before and after each collective (`collective_results`): one row
    per rank, one column per collective, one box per element, in the grey of the rank it came from
    (white: a sum over all ranks)."""
    world, width = len(inputs), inputs[0].numel()
    if set(results) != set(COLLECTIVES) or any(len(v) != world for v in results.values()):
        raise ValueError(f"results must map each of {', '.join(COLLECTIVES)} to one tensor per "
                         f"rank, as collective_results returns")
    columns = [("before: each rank's input", [[(v, r) for v in t.tolist()] for r, t in enumerate(inputs)])]
    columns.append(("all-reduce (sum)", [[(v, None) for v in t.tolist()] for t in results["all_reduce"]]))
    columns.append(("all-gather", [[(v, i // width) for i, v in enumerate(t.tolist())]
                                   for t in results["all_gather"]]))
    columns.append(("reduce-scatter (sum)", [[(v, None) for v in t.tolist()]
                                             for t in results["reduce_scatter"]]))
    sizes = [max(len(cells) for cells in rows) for _, rows in columns]
    gap = 1.2
    fig, ax = plt.subplots(figsize=(0.42 * (sum(sizes) + gap * len(sizes)) + 1.2, 0.75 * world + 0.6))
    blank_axes(ax, sum(sizes) + gap * len(sizes) + 1.0, world + 0.6)
    ax.invert_yaxis()
    x0 = 1.0
    for (title, rows), size in zip(columns, sizes):
        ax.text(x0 + size / 2, 0.35, title, ha="center", va="center", fontsize=9, fontweight="bold")
        for r, cells in enumerate(rows):
            for i, (value, source) in enumerate(cells):
                tint = SUM_TINT if source is None else RANK_TINTS[source % len(RANK_TINTS)]
                ax.add_patch(Rectangle((x0 + i, r + 0.6), 0.95, 0.8, facecolor=tint,
                                       edgecolor="#555555", linewidth=0.8))
                ax.text(x0 + i + 0.475, r + 1.0, f"{value:g}", ha="center", va="center", fontsize=8)
        x0 += size + gap
    for r in range(world):
        ax.text(0.9, r + 1.0, f"rank {r}", ha="right", va="center", fontsize=9)
    fig.tight_layout()
    return fig


def plot_wire_bytes(results: dict[str, DistributedResult]) -> Figure:
    """Stacked bars: kB each rank sent per step in each collective (hatching), one bar per run,
    each part filled with the colour of the dtype it carried."""
    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(results)
    bottom = [0.0] * len(names)
    sent = {n: results[n].wire_bytes_per_step for n in names}
    for kind in COLLECTIVES:
        values = [sent[n].get(kind, 0) / 1e3 for n in names]
        colours = [dtype_colour(results[n].run.wire_dtypes.get(kind)) for n in names]
        ax.bar(names, values, bottom=bottom, color=colours, hatch=COLLECTIVE_HATCHES[kind],
               edgecolor="#333333", linewidth=0.6, gid=kind)
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.1f}", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, 1.12 * max(bottom))
    worlds = sorted({r.world_size for r in results.values()})
    ax.set_ylabel("kB sent per step, per rank")
    ax.set_title(f"Bytes on the wire per step (ring algorithms, {', '.join(map(str, worlds))} ranks)")
    ax.tick_params(axis="x", labelrotation=15)
    ax.spines[["top", "right"]].set_visible(False)
    kinds = [Patch(facecolor="white", edgecolor="#333333", hatch=COLLECTIVE_HATCHES[k],
                   label=k.replace("_", "-")) for k in COLLECTIVES]
    carried = {dtype_label(d) for r in results.values() for d in r.run.wire_dtypes.values()}
    dtypes = [Patch(facecolor=DTYPE_COLOURS[n], edgecolor="#333333", label=n)
              for n in DTYPE_COLOURS if n in carried]
    ax.legend(handles=kinds + dtypes, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9,
              title="collective, dtype", title_fontsize=9)
    fig.tight_layout()
    return fig
