"""Pictures of one training step, drawn from what torch and mpcourse computed (lessons 03 to 05).

Each function takes a recorded result and returns a matplotlib Figure showing one idea, so a
lesson cell is one computation and one call:

- `dtype_flow`: the dtype of every tensor in one training step of a recipe, as
  `mpcourse.amp.recipe_step.step_dtypes` recorded them from a real tiny step under `torch.autocast`,
  so the picture cannot drift from torch.
- `master_weight_loop`: FP32 masters and 16-bit working copies, with the walk of a weight
  that receives many small updates (`mpcourse.amp.update_walk.master_walk`).
- `loss_scaler_states`: the dynamic loss scaler's rule as a state machine, beside the scale
  that `mpcourse.amp.scaling.GradScaler` chose on a run with injected overflows
  (`mpcourse.amp.scaling_experiments.scale_trace`).

Colours: one colour per dtype in every picture (`DTYPE_COLOURS`, the Okabe-Ito palette, which
stays distinguishable under the common colour-vision deficiencies).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from mpcourse.numbers import precision
from mpcourse.numbers.formats import BF16
from mpcourse.numbers.inspect_value import neighbours
from mpcourse.amp.recipe_step import Recipe, StepDtypes
from mpcourse.amp.scaling import GradScaler
from mpcourse.amp.scaling_experiments import ScaleTrace
from mpcourse.amp.update_walk import MasterWalk

#: One colour per number format, the same in every picture (Okabe-Ito, colour-blind safe).
DTYPE_COLOURS = {"fp32": "#0072B2", "tf32": "#56B4E9", "bf16": "#E69F00", "fp16": "#D55E00",
                 "fp8_e4m3": "#009E73", "fp8_e5m2": "#CC79A7"}
#: The colour of anything that is not a floating-point format (integer indices, no tensor).
OTHER_COLOUR = "#999999"


def dtype_label(dtype: torch.dtype | str | None) -> str:
    """The short name a picture prints for `dtype` ("fp32", "bf16", ...; "int64", "-")."""
    return dtype if isinstance(dtype, str) else precision.short_name(dtype)


def dtype_colour(dtype: torch.dtype | str | None) -> str:
    """The colour every picture uses for `dtype` (grey for anything not in `DTYPE_COLOURS`)."""
    return DTYPE_COLOURS.get(dtype_label(dtype), OTHER_COLOUR)


# ---------------------------------------------------------------- drawing helpers

def box(ax, x: float, y: float, title: str, dtype=None, *, width: float = 2.0,
        height: float = 0.9, gid: str | None = None, dashed: bool = False, note: str = "") -> None:
    """A rounded box centred at (x, y): `title` above, the dtype's name below, in its colour.

    The dtype text gets `gid` so that tests can find what a picture claims.
    """
    colour = dtype_colour(dtype) if dtype is not None else OTHER_COLOUR
    ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor=colour + "33", edgecolor=colour, linewidth=2,
                                linestyle="--" if dashed else "-"))
    if dtype is None:
        ax.text(x, y, title, ha="center", va="center", fontsize=10)
        return
    ax.text(x, y + 0.17, title, ha="center", va="center", fontsize=9.5)
    ax.text(x, y - 0.2, dtype_label(dtype) + note, ha="center", va="center", fontsize=11,
            fontweight="bold", color=colour if dtype_label(dtype) != "-" else "black", gid=gid)


def arrow(ax, start: tuple[float, float], end: tuple[float, float], label: str = "", *,
          offset: tuple[float, float] = (0, 0.22), colour: str = "#333333",
          rad: float = 0.0, fontsize: float = 8.5) -> None:
    """An arrow from `start` to `end`, with `label` beside its middle."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14,
                                 color=colour, linewidth=1.4,
                                 connectionstyle=f"arc3,rad={rad}"))
    if label:
        middle = ((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1])
        ax.text(*middle, label, ha="center", va="center", fontsize=fontsize, color="#222222",
                style="italic")


def blank_axes(ax, width: float, height: float) -> None:
    """Axes in box units, with no frame and no ticks."""
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")


def dtype_legend(ax, names: list[str], **kwargs) -> None:
    """A legend with one coloured patch per dtype name."""
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=DTYPE_COLOURS[n] + "33",
                             edgecolor=DTYPE_COLOURS[n], linewidth=2) for n in names]
    ax.legend(handles, names, **{"frameon": False, "fontsize": 9, **kwargs})


# ---------------------------------------------------------------- 1. dtype flow of one step

def recipe_title(recipe: Recipe) -> str:
    """A one-line name for a recipe, e.g. "FP32 parameters + autocast bf16 + GradScaler"."""
    if recipe.param_dtype == torch.float32:
        text = "FP32 parameters"
    else:
        text = f"{dtype_label(recipe.param_dtype)} parameters with FP32 masters"
    if recipe.autocast_dtype is not None:
        text += f" + autocast {dtype_label(recipe.autocast_dtype)}"
    return text + (" + GradScaler" if recipe.grad_scaler else "")


def dtype_flow(d: StepDtypes) -> Figure:
    """The dtype of each tensor in one training step of a recipe, as torch really ran it.

    Forward runs left to right along the top, backward and the optimizer right to left along
    the bottom. Each box shows a tensor and the dtype `mpcourse.amp.recipe_step.step_dtypes`
    recorded for it.
    """
    masters = d.optimizer_param != d.parameter
    fig, ax = plt.subplots(figsize=(12, 5.4))
    blank_axes(ax, 12, 5.4)
    top, middle, bottom, xs = 4.5, 2.65, 0.8, (1.2, 4.4, 7.6, 10.8)
    box(ax, xs[0], top, "parameters (stored)", d.parameter, gid="parameter")
    box(ax, xs[1], top, "weight in the matmul", d.matmul_operand, gid="matmul_operand")
    box(ax, xs[2], top, "activations", d.activation, gid="activation")
    box(ax, xs[3], top, "loss", d.loss, gid="loss")
    cast = d.matmul_operand != d.parameter
    arrow(ax, (xs[0] + 1, top), (xs[1] - 1, top),
          "autocast casts it\n(once per region)" if cast else "used as stored", offset=(0, 0.4))
    arrow(ax, (xs[1] + 1, top), (xs[2] - 1, top), "forward ops", offset=(0, 0.3))
    arrow(ax, (xs[2] + 1, top), (xs[3] - 1, top), "cross_entropy", offset=(0, 0.3))
    if d.scaled_loss is not None:
        box(ax, xs[3], bottom, "scaled loss", d.scaled_loss, gid="scaled_loss")
        label = "× S  (scaler.scale)"
    else:
        box(ax, xs[3], bottom, "no loss scaling", None, dashed=True)
        label = ""
    arrow(ax, (xs[3], top - 0.45), (xs[3], bottom + 0.45), label, offset=(-0.85, 0.0))
    box(ax, xs[2], bottom, "activation gradients", d.activation_grad, gid="activation_grad")
    box(ax, xs[1], bottom, "parameter .grad", d.parameter_grad, gid="parameter_grad")
    box(ax, xs[0], bottom, "FP32 master .grad" if masters else "optimizer's .grad",
        d.optimizer_grad, gid="optimizer_grad")
    for right, left in ((xs[3], xs[2]), (xs[2], xs[1])):
        arrow(ax, (right - 1, bottom), (left + 1, bottom), "backward", offset=(0, 0.3))
    arrow(ax, (xs[1] - 1, bottom), (xs[0] + 1, bottom),
          "copied up (exact)" if masters else "same tensor", offset=(0, 0.3))
    box(ax, xs[0], middle, f"AdamW updates (state {dtype_label(d.optimizer_state)})",
        d.optimizer_param, gid="optimizer_param", width=2.3)
    unscale = ("unscale_ ÷ S, " if d.scaled_loss is not None else "") + "clip"
    arrow(ax, (xs[0], bottom + 0.45), (xs[0], middle - 0.45), unscale, offset=(1.25, 0))
    arrow(ax, (xs[0], middle + 0.45), (xs[0], top - 0.45),
          f"rounded into the {dtype_label(d.parameter)} copy" if masters else "in place",
          offset=(1.45 if masters else 0.6, 0))
    ax.text(0.1, 5.3, "forward →", fontsize=10, fontweight="bold", color="#555555", va="top")
    ax.text(11.9, 0.05, "← backward", fontsize=10, fontweight="bold", color="#555555",
            ha="right", va="bottom")
    ax.set_title(f"One training step: {recipe_title(d.recipe)}",
                 fontsize=12)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- 2. the master-weight loop

def master_weight_loop(d: StepDtypes, walks: MasterWalk) -> Figure:
    """Left: the loop between FP32 masters and 16-bit working weights, with the dtypes of a
    real step whose parameters are 16-bit (`mpcourse.amp.recipe_step.step_dtypes`). Right: a weight
    under many small updates, kept alone in BF16 and kept as an FP32 master
    (`mpcourse.amp.update_walk.master_walk`)."""
    if d.optimizer_param == d.parameter:
        raise ValueError(f"the step has no masters: its parameters are {d.parameter}, and the "
                         "optimizer updates them directly; record a step with 16-bit parameters")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), width_ratios=(1.1, 1))
    blank_axes(left, 6.4, 4.6)
    (x0, x1), (y0, y1) = (1.35, 5.0), (0.75, 3.55)
    box(left, x0, y1, "master weight", d.optimizer_param, gid="master", width=2.3)
    box(left, x1, y1, "working weight", d.parameter, gid="working", width=2.3)
    box(left, x1, y0, "working .grad", d.parameter_grad, gid="working_grad", width=2.3)
    box(left, x0, y0, "master .grad", d.optimizer_grad, gid="master_grad", width=2.3)
    arrow(left, (x0 + 1.15, y1), (x1 - 1.15, y1), "round to nearest", offset=(0, 0.25))
    arrow(left, (x1, y1 - 0.45), (x1, y0 + 0.45), "forward and\nbackward", offset=(-0.75, 0))
    arrow(left, (x1 - 1.15, y0), (x0 + 1.15, y0), "copied up (exact)", offset=(0, 0.25))
    arrow(left, (x0, y0 + 0.45), (x0, y1 - 0.45), "optimizer\nstep", offset=(0.65, 0))
    left.set_title(f"FP32 masters, {dtype_label(d.parameter).upper()} working copies",
                   fontsize=12)

    start, update, steps, alone = walks.start, walks.update, walks.steps, walks.alone
    gap = neighbours(start, BF16)[1] - start
    k = range(steps + 1)
    right.plot(k, walks.master, color=DTYPE_COLOURS["fp32"], linestyle="--", linewidth=2,
               label="FP32 master", gid="master_walk")
    right.step(k, walks.working, where="post", color=DTYPE_COLOURS["bf16"], linewidth=2,
               label="its BF16 working copy", gid="working_walk")
    right.plot(k, alone, color="black", linewidth=2, label="BF16 weight alone", gid="alone_walk")
    right.set_xlabel(f"updates of {update:g}")
    right.set_ylabel("weight")
    right.legend(frameon=False, fontsize=9, loc="upper left")
    right.grid(alpha=0.3)
    right.text(steps * 0.98, start + gap * 0.15,
               f"{start:g} + {update:g} rounds back to {float(alone[1]):g}:\n"
               f"BF16's spacing at {start:g} is {gap:g},\nhalf of it {gap / 2:g} > {update:g}",
               ha="right", va="bottom", fontsize=9)
    right.set_title(f"{steps} updates of {update:g} to a weight of {start:g}", fontsize=12)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- 3. the dynamic loss scaler

def loss_scaler_states(trace: ScaleTrace) -> Figure:
    """Left: `GradScaler`'s rule, with torch's names and defaults. Right: the scale a real
    `mpcourse.amp.scaling.GradScaler` chose in a run whose gradients overflowed on purpose."""
    default = GradScaler()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), width_ratios=(1.25, 1))
    blank_axes(left, 7.4, 4.8)
    grey = "#999999"
    box(left, 3.5, 4.3, "scaler.scale(loss).backward()", width=3.6, height=0.6)
    box(left, 3.5, 3.1, "unscale_: any inf or NaN\nin the gradients?", width=3.0, height=0.75)
    box(left, 1.5, 1.55, "skip optimizer.step()\n"
        f"scale × backoff_factor ({default.get_backoff_factor():g})\ngrowth_tracker = 0",
        width=2.8, height=1.0)
    box(left, 5.2, 2.05, "optimizer.step()\ngrowth_tracker += 1", width=2.4, height=0.7)
    box(left, 5.2, 0.6, f"growth_tracker == growth_interval ({default.get_growth_interval()})?\n"
        f"then scale × growth_factor ({default.get_growth_factor():g})\nand growth_tracker = 0",
        width=3.4, height=1.0)
    for text in left.texts:
        text.set_fontsize(9)
    arrow(left, (3.5, 4.0), (3.5, 3.5))
    arrow(left, (2.7, 2.72), (1.9, 2.08), "yes", offset=(-0.2, 0.15))
    arrow(left, (4.3, 2.72), (4.9, 2.43), "no", offset=(0.15, 0.2))
    arrow(left, (5.2, 1.7), (5.2, 1.12))
    arrow(left, (0.2, 2.0), (1.7, 4.3), "next iteration", offset=(-0.35, 0.25), colour=grey,
          rad=-0.3)
    arrow(left, (6.9, 0.6), (5.3, 4.3), "next iteration", offset=(0.75, 0.3), colour=grey,
          rad=0.45)
    left.set_title("The dynamic loss scaler, once per iteration", fontsize=12)

    right.step(range(len(trace.scales)), trace.scales, where="post", color="black", linewidth=2,
               gid="scale_trace")
    for i, s in enumerate(trace.overflow_steps):
        right.axvspan(s - 0.5, s + 0.5, color=grey, alpha=0.35,
                      label="inf gradient: step skipped" if i == 0 else None)
    right.set_yscale("log", base=2)
    right.set_xlabel("iteration")
    right.set_ylabel("scale S")
    right.legend(frameon=False, fontsize=9, loc="lower right")
    right.grid(alpha=0.3)
    right.set_title(f"A real GradScaler, growth_interval={trace.growth_interval}", fontsize=12)
    fig.tight_layout()
    return fig
