"""Pictures of where the dtypes go inside an op, a layer and a sharded step (lessons 03, 07, 08).

- `autocast_blocks`: a traced region of `mpcourse.amp.autocast` as a row of blocks, one per op,
  coloured by the dtype the op produced and labelled with its autocast category.
- `fp8_linear_dataflow`: the FP8 linear of `mpcourse.lowbit.fp8`: amax, scale, quantize, matmul,
  dequantize, with the formats' limits and where current and delayed scaling keep the scales.
- `collective_timeline`: FSDP2's all-gathers and reduce-scatters per block against DDP's
  all-reduce, annotated with the bytes each rank puts on the wire
  (`mpcourse.distributed.wire_bytes`).

Colours are `mpcourse.views.diagrams.DTYPE_COLOURS`, the same as in every other picture.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from mpcourse.amp.autocast_mode import Trace
from mpcourse.distributed.costs import wire_bytes
from mpcourse.numbers.formats import FP8_E4M3, FP8_E5M2
from mpcourse.lowbit.fp8 import DelayedScaling, Fp8Linear
from mpcourse.train.models import Block, GPTConfig
from mpcourse.views.diagrams import (DTYPE_COLOURS, arrow, blank_axes, box, dtype_colour,
                                     dtype_label, dtype_legend)

_CATEGORY_LABELS = {"lower_precision": "lower_precision", "fp32": "fp32 list",
                    "promote": "promote", None: "no entry"}


# ---------------------------------------------------------------- 6. an autocast trace as blocks

def autocast_blocks(trace: Trace, per_row: int = 8, title: str = "") -> Figure:
    """One block per op of `trace`, in call order, filled with the colour of its output dtype.

    Each block names the op, its autocast category ("no entry": the op runs in whatever dtype
    its inputs have) and the dtypes it received; the corner counts the casts autocast put in
    front of it (copies the weight cache served are not counted).
    """
    if not isinstance(trace, Trace) or not trace:
        raise ValueError("trace must be a non-empty mpcourse.amp.autocast Trace, from "
                         "`with mpcourse.amp.autocast(..., trace=True) as region:` ... region.trace")
    if not isinstance(per_row, int) or per_row < 1:
        raise ValueError(f"per_row must be a positive integer, got {per_row!r}")
    rows = -(-len(trace) // per_row)
    fig, ax = plt.subplots(figsize=(12, 0.95 * rows + 1.0))
    blank_axes(ax, per_row * 1.5, rows * 1.1 + 0.1)
    ax.invert_yaxis()
    for i, record in enumerate(trace):
        x, y = (i % per_row) * 1.5 + 0.05, (i // per_row) * 1.1 + 0.1
        colour = dtype_colour(record.output_dtype)
        ax.add_patch(Rectangle((x, y), 1.4, 0.95, facecolor=colour + "55", edgecolor=colour,
                               linewidth=2, gid=f"op{i}"))
        name = record.op if len(record.op) <= 17 else record.op[:16] + "…"
        ax.text(x + 0.7, y + 0.3, name, ha="center", va="center", fontsize=8.5,
                fontweight="bold")
        ax.text(x + 0.7, y + 0.55, _CATEGORY_LABELS[record.category], ha="center", va="center",
                fontsize=8, style="italic", color="#333333")
        inputs = ",".join(dtype_label(d) for d in record.input_dtypes)
        ax.text(x + 0.7, y + 0.8, f"in: {inputs}", ha="center", va="center", fontsize=7.5,
                color="#333333", gid=f"inputs{i}")
        casts = sum(not c.cached for c in record.casts)
        if casts:
            ax.text(x + 1.36, y + 0.04, f"{casts} cast{'s' * (casts > 1)}", ha="right",
                    va="top", fontsize=7, gid=f"casts{i}")
    present = [n for n in DTYPE_COLOURS if any(dtype_label(r.output_dtype) == n for r in trace)]
    dtype_legend(ax, present, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(present))
    ax.set_title((title + "\n" if title else "") + "each op in call order, coloured by the dtype "
                 "it produced; 'in': the dtypes it received; corner: casts autocast inserted",
                 fontsize=10, pad=28)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- 4. the FP8 linear

def fp8_linear_dataflow(layer: Fp8Linear, x: torch.Tensor, y: torch.Tensor) -> Figure:
    """Forward and backward of `mpcourse.lowbit.fp8.Fp8Linear`: which tensor goes to which FP8 format,
    how its scale is made, and where current and delayed scaling keep the scales.

    The dtypes are read off `layer` (delayed scaling, the default) after one forward pass of
    `x` to `y` and one backward pass."""
    if not isinstance(layer, Fp8Linear) or not isinstance(layer.input_scaling, DelayedScaling):
        raise ValueError(f"layer must be an Fp8Linear with delayed scaling (the default), got "
                         f"{layer!r}")
    if layer.weight.grad is None:
        raise ValueError("layer's weight has no gradient: run one forward and backward pass "
                         "through it first, so that the picture can read the dtypes off")
    history = len(layer.input_scaling.amax_history)
    scale_dtype = dtype_label(layer.input_scaling.scale.dtype)
    e4m3, e5m2 = FP8_E4M3.max, FP8_E5M2.max
    fig, ax = plt.subplots(figsize=(12, 5.6))
    blank_axes(ax, 12, 5.6)
    cols = (1.0, 3.55, 6.2, 8.75, 11.0)
    rows = {"x": 4.85, "w": 3.65, "g": 1.85}
    box(ax, cols[0], rows["x"], "input x", x.dtype, width=1.7, gid="input")
    box(ax, cols[0], rows["w"], "weight W (master)", layer.weight.dtype, width=1.7, gid="weight")
    box(ax, cols[0], rows["g"], "output gradient dY", y.dtype, width=1.7, gid="output_grad")
    for key, sym, fmt, limit in (("x", "x", "fp8_e4m3", e4m3), ("w", "W", "fp8_e4m3", e4m3),
                                 ("g", "dY", "fp8_e5m2", e5m2)):
        y_row = rows[key]
        box(ax, cols[1], y_row, f"s_{sym} = {limit:g} / amax", width=2.1, height=0.7)
        box(ax, cols[2], y_row, f"round({sym} · s_{sym}) to", fmt, width=1.9, gid=f"format_{key}")
        arrow(ax, (cols[0] + 0.85, y_row), (cols[1] - 1.05, y_row), "amax", offset=(0, 0.2))
        arrow(ax, (cols[1] + 1.05, y_row), (cols[2] - 0.95, y_row))
    box(ax, cols[3], 4.25, "matmul, then\n÷ (s_x · s_W)", width=1.9, height=0.9)
    box(ax, cols[4], 4.25, "output y", y.dtype, width=1.6, gid="output")
    box(ax, cols[3], 1.85, "dX = dY · W\ndW = dYᵀ · x, then\n÷ (s_dY · s_W or s_x)",
        width=2.0, height=1.0)
    box(ax, cols[4], 1.85, "dX, dW", layer.weight.grad.dtype, width=1.6, gid="grads")
    arrow(ax, (cols[2] + 0.95, rows["x"]), (cols[3] - 0.95, 4.45))
    arrow(ax, (cols[2] + 0.95, rows["w"]), (cols[3] - 0.95, 4.05))
    arrow(ax, (cols[3] + 0.95, 4.25), (cols[4] - 0.8, 4.25))
    arrow(ax, (cols[2] + 0.95, rows["g"]), (cols[3] - 0.95, 1.85))
    arrow(ax, (cols[3] + 0.95, 1.85), (cols[4] - 0.8, 1.85))
    arrow(ax, (cols[2], rows["w"] - 0.45), (cols[3] - 0.5, 2.3), "x₈, W₈ saved\nfor backward",
          offset=(-0.55, 0.05), colour="#888888")
    ax.text(0.1, 5.5, "forward", fontsize=10, fontweight="bold", color="#555555", va="top")
    ax.text(0.1, 2.6, "backward", fontsize=10, fontweight="bold", color="#555555", va="top")
    ax.plot([0.1, 11.9], [2.85, 2.85], color="#cccccc", linewidth=1)
    ax.text(0.1, 0.95, f"where each s comes from (one {scale_dtype} scalar per tensor, kept in "
            "the layer: input_scaling, weight_scaling, grad_scaling):", fontsize=9.5,
            fontweight="bold", va="center")
    ax.text(0.1, 0.55, "current scaling: from this tensor's own amax (one more pass over it "
            "before the cast)", fontsize=9.5, va="center")
    ax.text(0.1, 0.18, f"delayed scaling: from the largest of the last {history} amaxes, kept "
            "in the layer (amax_history); this tensor's amax joins the history after the cast",
            fontsize=9.5, va="center")
    ax.set_title(f"The FP8 linear: E4M3 (max {e4m3:g}) forward, E5M2 (max {e5m2:g}) backward",
                 fontsize=12)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- 5. FSDP2 and DDP collectives

def _kb(n: int) -> str:
    return f"{n / 1e3:.0f} kB" if n >= 1e4 else f"{n / 1e3:.1f} kB"


def collective_timeline(world_size: int = 2, num_blocks: int | None = None,
                        param_dtype: torch.dtype = torch.bfloat16,
                        reduce_dtype: torch.dtype = torch.float32,
                        reshard_after_forward: bool = True,
                        model_config: GPTConfig | None = None) -> Figure:
    """One step of the transformer blocks of `model_config` (default: `GPTConfig()`;
    `num_blocks` of them, default its `n_layers`) under FSDP2 and under DDP: compute above,
    each rank's collectives below, labelled with the bytes each rank sends (`wire_bytes`).
    Only the blocks are drawn: the embeddings and final norm around them form one more unit."""
    model_config = model_config or GPTConfig()
    num_blocks = model_config.n_layers if num_blocks is None else num_blocks
    if not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
    per_block = sum(p.numel() for p in Block(model_config).parameters())
    fsdp = wire_bytes("fsdp2", per_block, world_size, param_dtype, reduce_dtype,
                      reshard_after_forward)
    ddp = wire_bytes("ddp", per_block, world_size)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 5.4), sharex=True)
    n, grey = num_blocks, "#dddddd"

    def bar(ax, lane, start, width, label, colour, gid=None):
        ax.add_patch(Rectangle((start, lane - 0.38), width, 0.76, facecolor=colour,
                               edgecolor="#555555", linewidth=0.8, gid=gid))
        ax.text(start + width / 2, lane, label, ha="center", va="center", fontsize=7.5)

    p_col, r_col = dtype_colour(param_dtype) + "99", dtype_colour(reduce_dtype) + "99"
    for i in range(n):  # FSDP2 forward: gather block i (prefetched during block i-1), compute
        bar(top, 0, 1 + 2 * i, 1, f"AG {i + 1}\n{_kb(fsdp['all_gather_forward'])}", p_col,
            gid="all_gather_forward")
        bar(top, 1, 2 + 2 * i, 2, f"forward {i + 1}", grey)
    back = 2 + 2 * n
    for j, i in enumerate(reversed(range(n))):  # backward: gather again, compute, reduce-scatter
        if reshard_after_forward:
            bar(top, 0, back - 1 + 2 * j, 1,
                f"AG {i + 1}\n{_kb(fsdp['all_gather_backward'])}", p_col,
                gid="all_gather_backward")
        bar(top, 1, back + 2 * j, 2, f"backward {i + 1}", grey)
        bar(top, -1, back + 2 + 2 * j, 1.6, f"RS {i + 1}\n{_kb(fsdp['reduce_scatter'])}",
            r_col, gid="reduce_scatter")
    for i in range(n):  # DDP: compute only, then one all-reduce per gradient bucket
        bar(bottom, 1, 2 + 2 * i, 2, f"forward {i + 1}", grey)
        bar(bottom, 1, back + 2 * i, 2, f"backward {n - i}", grey)
        bar(bottom, 0, back + 2 + 2 * i, 1.8, f"all-reduce\n{_kb(ddp['all_reduce'])}",
            dtype_colour(torch.float32) + "99", gid="all_reduce")
    fsdp_total, ddp_total = n * sum(fsdp.values()), n * ddp["all_reduce"]
    reshard = "resharded after forward" if reshard_after_forward else "kept after forward"
    top.set_title(f"FSDP2 (param_dtype={dtype_label(param_dtype)}, reduce_dtype="
                  f"{dtype_label(reduce_dtype)}, {reshard}): {_kb(fsdp_total)} sent per rank "
                  f"for {n} blocks",
                  fontsize=11, gid="fsdp_total")
    bottom.set_title(f"DDP (FP32 gradient buckets): {_kb(ddp_total)} sent per rank for {n} blocks",
                     fontsize=11, gid="ddp_total")
    for ax, lanes in ((top, ("reduce-scatter", "all-gather", "compute")),
                      (bottom, ("all-reduce", "compute"))):
        ax.set_yticks(range(-1, 2) if len(lanes) == 3 else range(0, 2), lanes)
        ax.set_ylim(-1.6 if len(lanes) == 3 else -0.6, 1.6)
        ax.spines[["top", "right", "left"]].set_visible(False)
        ax.tick_params(left=False)
    bottom.set_xlim(0.8, back + 2 * n + 2.0)
    names = [name for name in DTYPE_COLOURS
             if name in {dtype_label(param_dtype), dtype_label(reduce_dtype), "fp32"}]
    dtype_legend(top, names, loc="upper right", title="on the wire", title_fontsize=9)
    bottom.set_xticks([])
    bottom.set_xlabel(f"time →   (world size {world_size}, {per_block:,} parameters per block; "
                      "kB = bytes each rank sends, ring algorithms)")
    fig.tight_layout()
    return fig
