"""Training runs side by side: tables and loss plots of `RunResult`s (lessons 06 to 11)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mpcourse.train import RunResult

UNACCELERATED_MARK = "*"
STOPPED_MARK = "+"
TABLE_NOTES = {
    UNACCELERATED_MARK: "not accelerated on this device (emulated or unaccelerated path): "
                        "not the speed this precision has on hardware built for it",
    STOPPED_MARK: "stopped early at its time limit (fewer steps: its losses are not comparable)",
}


@dataclass
class RunComparison:
    """Runs side by side: `str()` is the table, `html()` the same as an HTML table, `plot()`."""
    results: list[RunResult]

    def __str__(self) -> str:
        return format_table(self.results)

    def html(self) -> str:
        return html_table(self.results)

    def plot(self, ax=None):
        return plot_losses(self.results, ax=ax)


def table_rows(results: list[RunResult]) -> list[dict[str, str]]:
    """One row of formatted cells per run; speed-up is against the first fp32 run on that device."""
    baselines = {}
    for r in results:
        if r.config.precision == "fp32":
            baselines.setdefault(r.device, r.tokens_per_s)
    rows = []
    for r in results:
        baseline = baselines.get(r.device)
        marks = (UNACCELERATED_MARK if not r.accelerated else "") + (STOPPED_MARK if r.stopped_early else "")
        rows.append({
            "run": r.config.label + marks,
            "device": r.device,
            "steps": f"{r.steps_done}/{r.config.steps}",
            "tokens/s": f"{r.tokens_per_s:,.0f}",
            "speed-up vs fp32": f"{r.tokens_per_s / baseline:.2f}x" if baseline else "-",
            "peak memory": f"{r.peak_memory_bytes / 1e6:,.2f} MB",
            "final loss": f"{r.final_loss:.4f}",
            "eval loss": f"{r.eval_loss:.4f}",
            "skipped": str(len(r.skipped_steps)),
        })
    return rows


def _notes(results: list[RunResult]) -> list[str]:
    used = {UNACCELERATED_MARK: any(not r.accelerated for r in results),
            STOPPED_MARK: any(r.stopped_early for r in results)}
    return [f"{mark} {text}" for mark, text in TABLE_NOTES.items() if used[mark]]


def format_table(results: list[RunResult]) -> str:
    """The runs as a plain-text table, with notes for marked rows."""
    rows = table_rows(results)
    if not rows:
        return "(no runs yet)"
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    line = lambda cells: "  ".join(  # noqa: E731
        cells[c].ljust(widths[c]) if i == 0 else cells[c].rjust(widths[c]) for i, c in enumerate(columns))
    lines = [line({c: c for c in columns}), "  ".join("-" * widths[c] for c in columns)]
    lines += [line(row) for row in rows]
    return "\n".join(lines + _notes(results))


def html_table(results: list[RunResult]) -> str:
    """The runs as an HTML <table> (one <tr> per run), with notes for marked rows."""
    rows = table_rows(results)
    columns = list(rows[0]) if rows else ["run"]
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(row[c])}</td>" for c in columns) + "</tr>"
                   for row in rows)
    notes = "".join(f"<p><small>{escape(note)}</small></p>" for note in _notes(results))
    return (f'<table class="mpcourse-results"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>{notes}")


def moving_average(losses: list[float], smooth: int) -> tuple[range, torch.Tensor]:
    """The steps and the mean loss over each window of `smooth` steps (shorter for short runs)."""
    values = torch.tensor(losses, dtype=torch.float64)
    window = max(1, min(smooth, len(values) // 2))  # a short run still draws a line
    averaged = values.unfold(0, window, 1).mean(dim=1) if len(values) else values
    return range(window, window + len(averaged)), averaged


def plot_losses(results: list[RunResult], ax=None, smooth: int = 10,
                live: tuple[str, list[float]] | None = None):
    """Training-loss curves of the runs (moving average over `smooth` steps), with the floor;
    `live` is a run still in progress, as (label, losses so far)."""
    floors = {r.floor for r in results if not math.isnan(r.floor)}
    curves = [(r.config.label, r.losses) for r in results] + ([tuple(live)] if live else [])
    return plot_curves(curves, floors.pop() if len(floors) == 1 else None, ax=ax, smooth=smooth)


def plot_curves(curves: list[tuple[str, list[float]]], floor: float | None = None, ax=None,
                smooth: int = 10):
    """Loss curves given as (label, losses per step), e.g. of a run still in progress."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for label, losses in curves:
        ax.plot(*moving_average(losses, smooth), label=label)
    if floor is not None:
        ax.axhline(floor, color="gray", linestyle="--", linewidth=1,
                   label=f"best possible ({floor:.2f} nats)")
    ax.set_xlabel("training step")
    ax.set_ylabel(f"training loss (nats/token, mean of {smooth} steps)")
    ax.set_title("Loss curves")
    ax.legend(fontsize="small")
    return ax.figure


def plot_loss_differences(results: list[RunResult], baseline: RunResult | None = None, ax=None):
    """Each run's loss minus the FP32 run's, step by step: where curves overlap on a loss plot,
    the difference shows how far, and in which direction, a precision moves training."""
    import matplotlib.pyplot as plt
    if baseline is None:
        baseline = next((r for r in results if r.config.precision == "fp32"), None)
    if baseline is None:
        raise ValueError("no fp32 run among the results to subtract; pass baseline=")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        if r is baseline:
            continue
        steps = min(len(r.losses), len(baseline.losses))
        diff = [a - b for a, b in zip(r.losses[:steps], baseline.losses[:steps])]
        ax.plot(range(steps), diff, label=r.config.label, linewidth=1)
    ax.axhline(0.0, color="gray", linewidth=1)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"loss minus {baseline.config.label} loss (nats/token)")
    ax.set_title(f"How far each run's loss is from {baseline.config.label}'s")
    ax.legend(fontsize="small")
    return ax.figure
