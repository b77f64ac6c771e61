"""The lab's control panel: pick the switches, press Run, watch the loss, compare the runs.

The panel is thin: what each control means is decided by `config_from_controls`, what a run
shows by `mpcourse.train.train` and `mpcourse.views` (`html_table`, `plot_losses`), and the
panel's own state changes (`ControlPanel.run`) can be driven from a test with `run_button.click()`, no browser.
"""
from __future__ import annotations

import dataclasses
import warnings
from html import escape
from typing import NamedTuple

import ipywidgets as widgets

from mpcourse.train.sizing import lab_size
from mpcourse.numbers.precision import RUN_PRECISIONS
from mpcourse.train import AUTOCASTS, RunConfig, RunResult, StepInfo, fit_to_hardware, train
from mpcourse.views.runs import html_table, plot_losses


def config_from_controls(base: RunConfig, *, precision: str, loss_scaling: bool,
                         master_weights: bool, d_model: int, batch_size: int, steps: int,
                         autocast: str = "torch", slow_limit_s: float = 20.0) -> RunConfig:
    """The run the controls describe: `base` with the panel's choices, fitted to the hardware.

    The loss-scaling box means dynamic scaling (GradScaler) or none; a precision this device
    does not accelerate gets a time limit of `slow_limit_s` (see `fit_to_hardware`).
    """
    config = dataclasses.replace(
        base.with_steps(steps), precision=precision, autocast=autocast,
        loss_scaling="dynamic" if loss_scaling else "off", master_weights=master_weights,
        d_model=d_model, batch_size=batch_size)
    return fit_to_hardware(config, seconds=slow_limit_s)


class LiveRun(NamedTuple):
    """The run in progress, as the live plot draws it."""
    label: str
    losses: list[float]


def redraw_every(steps: int, times: int = 10) -> int:
    """Redraw the live plot about `times` times per run (drawing costs more than a tiny step)."""
    return max(1, steps // times)


class ControlPanel:
    """Precision toggles, size sliders and a Run button; a live loss plot and a results table.

    `ControlPanel().widget` is what a notebook displays. Each click of Run trains one
    configuration, redraws the loss curves as it goes, and appends a row to `results_table`
    (an HTML <table>), so runs can be compared side by side. Without a `base` configuration the
    panel starts at the lab's size for this machine (`mpcourse.train.sizing`) and says why.
    """

    def __init__(self, base: RunConfig | None = None, max_d_model: int = 256,
                 max_batch: int = 64, max_steps: int = 1000):
        sized = ""
        if base is None:
            size = lab_size()
            base, sized = size.config, f"Sized for this machine: {size.reason}. "
        self.base = base
        self.results: list[RunResult] = []
        style = {"description_width": "initial"}
        self.precision = widgets.ToggleButtons(options=RUN_PRECISIONS, value=base.precision,
                                               description="Precision", style=style)
        self.autocast = widgets.ToggleButtons(options=AUTOCASTS, value=base.autocast,
                                              description="Autocast and scaler from", style=style)
        self.loss_scaling = widgets.Checkbox(value=True, description="Loss scaling (dynamic)",
                                             style=style)
        self.master_weights = widgets.Checkbox(value=base.master_weights,
                                               description="FP32 master weights", style=style)
        step = base.n_heads * 8
        self.d_model = widgets.IntSlider(value=base.d_model, min=step, max=max(max_d_model, base.d_model),
                                         step=step, description="Model width (d_model)", style=style)
        self.batch_size = widgets.IntSlider(value=base.batch_size, min=1, max=max(max_batch, base.batch_size),
                                            description="Batch size", style=style)
        self.steps = widgets.IntSlider(value=base.steps, min=base.warmup_steps + 1,
                                       max=max(max_steps, base.steps), step=1,
                                       description="Steps", style=style)
        self.run_button = widgets.Button(description="Run", button_style="primary",
                                         tooltip="train with these settings and add a row to the table")
        self.status = widgets.HTML(value=escape(sized + "Choose the settings and press Run."))
        self.plot = widgets.Output()
        self.results_table = widgets.HTML(value=html_table([]))
        self.live: LiveRun | None = None
        self.run_button.on_click(lambda _button: self.run())
        controls = widgets.VBox([self.precision, self.autocast,
                                 widgets.HBox([self.loss_scaling, self.master_weights]),
                                 self.d_model, self.batch_size, self.steps, self.run_button,
                                 self.status])
        self.widget = widgets.VBox([controls, self.plot, self.results_table])

    def config(self) -> RunConfig:
        return config_from_controls(
            self.base, precision=self.precision.value, loss_scaling=self.loss_scaling.value,
            master_weights=self.master_weights.value, d_model=self.d_model.value,
            batch_size=self.batch_size.value, steps=self.steps.value, autocast=self.autocast.value)

    def run(self) -> RunResult:
        """Train the configuration the controls show; update the plot, status and table."""
        config = self.config()
        self.run_button.disabled = True
        self.live = LiveRun(config.label, [])
        every = redraw_every(config.steps)
        notes = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = train(config, [lambda info: self._on_step(info, every)])
            notes = [str(w.message) for w in caught]
        finally:
            self.run_button.disabled = False
            self.live = None
        self.results.append(result)
        self.results_table.value = html_table(self.results)
        self._draw(self.results)
        limit = (f" It stopped at its {config.time_limit_s:g} s limit after {result.steps_done} "
                 "steps." if result.stopped_early else "")
        self.status.value = escape(f"Done: {config.label}, eval loss {result.eval_loss:.4f}, "
                                   f"{result.tokens_per_s:,.0f} tokens/s.{limit} " + " ".join(notes))
        return result

    def _on_step(self, info: StepInfo, every: int) -> None:
        self.live.losses.append(info.loss)
        self.status.value = escape(f"step {info.step + 1}/{info.steps}: loss {info.loss:.4f}, "
                                   f"{info.tokens_per_s:,.0f} tokens/s, scale {info.scale:g}")
        if (info.step + 1) % every == 0:
            self._draw(self.results, live=self.live)

    def _draw(self, results: list[RunResult], live: LiveRun | None = None) -> None:
        import matplotlib.pyplot as plt
        from IPython.display import clear_output, display
        figure = plot_losses(results, live=live)
        with self.plot:
            clear_output(wait=True)
            display(figure)
        plt.close(figure)
