"""The control panel's logic, driven without a browser: controls -> config, Run -> a new row."""
import re

import matplotlib
import pytest

matplotlib.use("Agg")

from mpcourse.machine import hardware  # noqa: E402
from mpcourse.train import RunConfig  # noqa: E402
from mpcourse.widgets import ControlPanel, config_from_controls, redraw_every  # noqa: E402

BASE = RunConfig(d_model=16, n_layers=1, n_heads=2, vocab_size=32, batch_size=2, seq_len=8,
                 steps=4, warmup_steps=1, eval_batches=1, device="cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


def test_controls_map_onto_a_run_config():
    config = config_from_controls(BASE, precision="fp16", loss_scaling=False, master_weights=True,
                                  d_model=32, batch_size=3, steps=5, autocast="mpcourse")
    assert (config.precision, config.loss_scaling, config.master_weights, config.autocast) == \
        ("fp16", "off", True, "mpcourse")
    assert (config.d_model, config.batch_size, config.steps, config.seq_len) == (32, 3, 5, 8)
    # instructions (flags) and the calibration's word, as the loop asks (AMX's fp16: flags only)
    accelerated = hardware.report().precisions["fp16"].accelerated and hardware.is_fast("fp16")
    assert (config.time_limit_s is None) == accelerated, "slow precisions get a time limit"
    checked = config_from_controls(BASE, precision="fp32", loss_scaling=True, master_weights=False,
                                   d_model=16, batch_size=2, steps=1)
    assert checked.loss_scaling == "dynamic" and checked.warmup_steps == 0 and checked.time_limit_s is None


def test_redraw_about_ten_times_per_run():
    assert redraw_every(1000) == 100 and redraw_every(5) == 1


def table_rows(panel):
    return re.findall(r"<tr><td>(.*?)</td>", panel.results_table.value)


@pytest.mark.filterwarnings("ignore")
def test_clicking_run_trains_and_appends_a_row():
    panel = ControlPanel(BASE)
    assert table_rows(panel) == [] and "<table" in panel.results_table.value
    panel.precision.value = "bf16"
    panel.loss_scaling.value = False
    panel.run_button.click()
    assert len(panel.results) == 1 and panel.results[0].config.precision == "bf16"
    assert [row.rstrip("*+") for row in table_rows(panel)] == ["bf16"]
    assert panel.status.value.startswith("Done: bf16") and not panel.run_button.disabled
    panel.precision.value = "fp32"
    panel.steps.value = 3
    panel.run_button.click()
    assert [row.rstrip("*+") for row in table_rows(panel)] == ["bf16", "fp32"]
    assert len(panel.results[1].losses) == 3


def test_live_plot_sees_every_step():
    panel = ControlPanel(BASE)
    seen = []
    original = panel._on_step
    panel._on_step = lambda info, every: (original(info, every), seen.append(len(panel.live.losses)))
    panel.run()
    assert seen == [1, 2, 3, 4]


def test_widgets_say_what_they_are():
    panel = ControlPanel(BASE)
    descriptions = [w.description for w in (panel.precision, panel.loss_scaling, panel.master_weights,
                                            panel.d_model, panel.batch_size, panel.steps, panel.run_button)]
    assert descriptions == ["Precision", "Loss scaling (dynamic)", "FP32 master weights",
                            "Model width (d_model)", "Batch size", "Steps", "Run"]
    assert panel.precision.options == ("fp32", "tf32", "bf16", "fp16")
    assert panel.d_model.value % BASE.n_heads == 0 and panel.d_model.step % BASE.n_heads == 0


def test_panel_without_a_base_starts_at_the_labs_size_and_says_why(monkeypatch):
    import mpcourse.widgets
    from mpcourse.train.sizing import choose_lab_size
    from mpcourse.train import LESSON_CPU_MATMUL_CONFIG
    fast = hardware.MatmulProbe(256, {"fp32": 1.0, "bf16": 0.5, "fp16": 50.0})
    size = choose_lab_size("cpu", hardware.cpu_precisions(frozenset({"avx512_bf16"})), fast)
    monkeypatch.setattr(mpcourse.widgets, "lab_size", lambda: size)
    panel = ControlPanel()
    assert panel.base == LESSON_CPU_MATMUL_CONFIG
    assert panel.d_model.value == panel.d_model.max == LESSON_CPU_MATMUL_CONFIG.d_model
    assert panel.status.value.startswith("Sized for this machine: measured fast on this CPU")
    assert ControlPanel(BASE).status.value == "Choose the settings and press Run."
