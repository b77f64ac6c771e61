"""Views: tables and pictures drawn from what the mechanisms computed.

A view takes results (a `RunResult`, a `MemoryBreakdown`, a trace) and draws or formats them;
it never builds data or runs training itself, so a notebook, a widget, the CLI and a benchmark
can all show the same results the same way.

Lessons take their pictures from here: `from mpcourse.views import dtype_flow, plot_layouts`.
- `runs`: tables and loss curves of training runs (lessons 06, 07);
- `memory`: where training memory goes, and the step's peak over time (lesson 02);
- `diagrams`: one step's dtypes, the master-weight loop, the loss scaler's states (03 to 06);
- `dataflow_diagrams`: autocast's op blocks, the FP8 linear, collectives over time (03, 07, 08);
- `distributed`: collectives and bytes on the wire (lesson 08);
- `blockscale`: amax landings, error against K, the three matmuls, paired gaps, cost (lesson 10);
- `optimizers`: Kahan's split, the optimizer ladder and its rungs' memory (lesson 11).
"""
from mpcourse.views.blockscale import (plot_amax_landings, plot_cost_against_saving, plot_error_against_k,
                                       plot_paired_gaps, plot_three_matmuls)
from mpcourse.views.dataflow_diagrams import autocast_blocks, collective_timeline, fp8_linear_dataflow
from mpcourse.views.diagrams import dtype_colour, dtype_flow, loss_scaler_states, master_weight_loop
from mpcourse.views.distributed import collectives_picture, format_results, plot_wire_bytes
from mpcourse.views.memory import plot_layouts, plot_step_memory
from mpcourse.views.optimizers import plot_kahan_split, plot_ladder, plot_rung_memory
from mpcourse.views.runs import RunComparison, format_table, plot_loss_differences, plot_losses

__all__ = ["plot_amax_landings", "plot_cost_against_saving", "plot_error_against_k", "plot_paired_gaps",
           "plot_three_matmuls", "autocast_blocks", "collective_timeline", "fp8_linear_dataflow", "dtype_colour",
           "dtype_flow", "loss_scaler_states", "master_weight_loop", "collectives_picture", "format_results",
           "plot_wire_bytes", "plot_layouts", "plot_step_memory", "plot_kahan_split", "plot_ladder",
           "plot_rung_memory", "RunComparison", "format_table", "plot_loss_differences", "plot_losses"]
