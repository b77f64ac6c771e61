"""The training loop: every switch runs, matches hand-written torch, resumes bit for bit."""
import dataclasses
import itertools
import math
import warnings

import pytest
import torch

from mpcourse.machine import hardware
from mpcourse.train.data import Batches, MarkovText
from mpcourse.train.models import GPT, next_token_loss
from mpcourse.numbers.precision import RUN_PRECISIONS as PRECISIONS
from mpcourse.numbers.precision import PrecisionSupport
from mpcourse.train import (AUTOCASTS, LESSON_CPU_CONFIG, LOSS_SCALINGS, RunConfig, RunResult,
                            UnacceleratedPrecisionWarning, compare, fit_to_hardware,
                            precision_support, train)
from mpcourse.views.runs import format_table, html_table

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::mpcourse.train.UnacceleratedPrecisionWarning")]
TINY = RunConfig(d_model=16, n_layers=1, n_heads=2, vocab_size=32, batch_size=2, seq_len=8,
                 steps=3, warmup_steps=1, eval_batches=1, device="cpu")




@pytest.mark.parametrize("precision,autocast", list(itertools.product(PRECISIONS, AUTOCASTS)))
def test_every_combination_runs_with_finite_losses(precision, autocast):
    for scaling, master in itertools.product(LOSS_SCALINGS, (False, True)):
        config = dataclasses.replace(TINY, precision=precision, autocast=autocast,
                                     loss_scaling=scaling, master_weights=master)
        result = train(config)
        assert len(result.losses) == 3 and all(map(math.isfinite, result.losses)), config.label
        assert math.isfinite(result.eval_loss) and result.peak_memory_bytes > 0


def bare_torch_losses(config: RunConfig) -> list[float]:
    """The same run written by hand with torch only: the loop the library must equal."""
    torch.manual_seed(config.seed)
    batches = Batches(MarkovText(config.vocab_size, seed=config.seed), config.batch_size,
                      config.seq_len, seed=config.seed)
    model = GPT(config.model_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=config.init_scale,
                                  enabled=config.loss_scaling == "dynamic")
    losses = []
    for step in range(config.steps):
        x, y = batches.get(step)
        with torch.autocast("cpu", dtype=torch.float16, enabled=config.precision == "fp16"):
            loss = next_token_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_library_loop_equals_a_hand_written_torch_loop_bitwise(precision):
    config = dataclasses.replace(TINY, precision=precision, steps=5)
    assert train(config).losses == bare_torch_losses(config)


@pytest.mark.parametrize("precision,scaling", [("bf16", "off"), ("fp16", "dynamic"), ("fp16", "static")])
def test_mpcourse_mechanisms_give_torchs_results(precision, scaling):
    config = dataclasses.replace(TINY, precision=precision, loss_scaling=scaling, steps=4)
    ours = train(dataclasses.replace(config, autocast="mpcourse"))
    theirs = train(config)
    assert ours.losses == theirs.losses and ours.scales == theirs.scales


def test_dynamic_scaling_backs_off_and_skips_static_keeps_its_scale():
    config = dataclasses.replace(TINY, precision="fp16", init_scale=2.0**40, steps=6)
    for autocast in AUTOCASTS:
        result = train(dataclasses.replace(config, autocast=autocast))
        assert result.skipped_steps[0] == 0, "2**40 times an fp16 gradient overflows"
        assert result.scales[:2] == [2.0**40, 2.0**39]
        assert all(b == a / 2 for a, b, s in zip(result.scales, result.scales[1:], range(6))
                   if s in result.skipped_steps)
        static = train(dataclasses.replace(config, autocast=autocast, loss_scaling="static",
                                           static_scale=2.0**40))
        assert static.scales == [2.0**40] * 6 and static.skipped_steps == list(range(6))
        untrained = train(dataclasses.replace(config, autocast=autocast, loss_scaling="static",
                                              static_scale=2.0**40, steps=1, warmup_steps=0))
        assert static.eval_loss == untrained.eval_loss, "every step skipped: the model never moves"


def test_lesson_configuration_16_bit_runs_end_within_5_percent_of_fp32():
    base = dataclasses.replace(LESSON_CPU_CONFIG, device="cpu")
    runs = compare([base,
                    dataclasses.replace(base, precision="bf16", loss_scaling="off"),
                    dataclasses.replace(base, precision="fp16", loss_scaling="dynamic"),
                    dataclasses.replace(base, precision="fp16", loss_scaling="off", master_weights=True)])
    fp32 = runs[0].eval_loss
    uniform = MarkovText(base.vocab_size).uniform_loss
    assert fp32 < 0.5 * uniform, f"the model should learn the chain: eval loss {fp32} vs uniform {uniform}"
    for result in runs[1:]:
        assert abs(result.eval_loss - fp32) <= 0.05 * fp32, (result.config.label, result.eval_loss, fp32)


class StopAt:
    """A callback that presses Ctrl-C after step `k`."""
    def __init__(self, k):
        self.k = k

    def __call__(self, info):
        if info.step == self.k:
            raise KeyboardInterrupt


@pytest.mark.parametrize("precision,master", [("fp32", False), ("fp16", True), ("bf16", False)])
def test_interrupted_and_resumed_run_equals_the_uninterrupted_run_bitwise(tmp_path, precision, master):
    config = dataclasses.replace(TINY, precision=precision, master_weights=master, steps=8,
                                 growth_interval=2, init_scale=2.0**20)
    whole = train(config)
    path = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt):
        train(config, [StopAt(3)], checkpoint_path=path)
    assert path.exists(), "Ctrl-C must leave a checkpoint"
    torch.manual_seed(1234)  # disturb the RNG: the checkpoint must restore it
    resumed = train(config, checkpoint_path=path, resume=True)
    assert resumed.losses == whole.losses
    assert resumed.scales == whole.scales and resumed.eval_loss == whole.eval_loss
    assert len(set(whole.scales)) > 1, "the scale should change during the run, or the test shows nothing"


def test_resume_refuses_another_configuration(tmp_path):
    path = tmp_path / "run.pt"
    train(TINY, checkpoint_path=path)
    with pytest.raises(ValueError, match="lr=0.003 there, 0.1 here"):
        train(dataclasses.replace(TINY, lr=0.1), checkpoint_path=path, resume=True)
    longer = train(dataclasses.replace(TINY, steps=5), checkpoint_path=path, resume=True)
    assert longer.losses[:3] == train(TINY).losses and len(longer.losses) == 5
    with pytest.raises(FileNotFoundError):
        train(TINY, checkpoint_path=tmp_path / "missing.pt", resume=True)


def test_bad_configurations_name_the_bad_value():
    for field, value in (("precision", "fp8"), ("autocast", "apex"), ("loss_scaling", "auto")):
        with pytest.raises(ValueError, match=f"unknown {field} '{value}'"):
            RunConfig(**{field: value})
    with pytest.raises(ValueError, match="warmup_steps"):
        RunConfig(steps=2, warmup_steps=2)


def test_precision_support_errors_and_warnings(monkeypatch):
    with pytest.warns(UnacceleratedPrecisionWarning, match="runs as plain fp32"):
        precision_support("tf32", "cpu")
    with pytest.raises(ValueError, match="unknown precision 'fp64'"):
        precision_support("fp64", "cpu")
    volta = hardware.HardwareReport(torch_version="2.13", device_type="cuda", device_name="Tesla V100",
                                    compute_capability=(7, 0), threads=2, cpu_capability="AVX2",
                                    precisions=hardware.cuda_precisions((7, 0)))
    monkeypatch.setattr(hardware, "report", lambda: volta)
    with pytest.raises(ValueError, match="'tf32' cannot run on this cuda device: needs Ampere"):
        precision_support("tf32", "cuda")
    with pytest.warns(UnacceleratedPrecisionWarning, match="bf16 on this cuda is not accelerated .emulated"):
        precision_support("bf16", "cuda")  # runs, through FP32 arithmetic, before Ampere
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision_support("fp16", "cuda")  # tensor cores since Volta: no warning


def test_unaccelerated_precisions_get_a_time_limit_and_stop_early():
    fp32, fp16 = TINY, dataclasses.replace(TINY, precision="fp16")
    assert fit_to_hardware(fp32) == fp32
    # fast needs the instructions (flags) and the calibration's word: AMX's fp16 has the first only
    slow = not (hardware.report().precisions["fp16"].accelerated and hardware.is_fast("fp16"))
    assert (fit_to_hardware(fp16, seconds=5).time_limit_s == 5) == slow
    result = train(dataclasses.replace(TINY, steps=50, time_limit_s=0.0))
    assert result.stopped_early and len(result.losses) == 1


@pytest.mark.parametrize("bf16_speedup, limited", [(2.0, False), (0.02, True)])
def test_bf16_gets_a_time_limit_where_the_calibration_measured_it_slow(monkeypatch, bf16_speedup, limited):
    """The flags promise AVX512-BF16 in both cases; only the (faked) probe differs."""
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    monkeypatch.setattr(hardware, "measured_probe", lambda: hardware.MatmulProbe(
        256, {"fp32": 1e-3, "bf16": 1e-3 / bf16_speedup, "fp16": 0.1}))
    fitted = fit_to_hardware(dataclasses.replace(TINY, precision="bf16"), seconds=7)
    assert fitted.time_limit_s == (7 if limited else None)
    assert fit_to_hardware(TINY).time_limit_s is None, "fp32 is never limited"


def test_tokens_per_s_leaves_out_warm_up_steps():
    result = RunResult(TINY, "cpu", True, losses=[1.0] * 3, step_seconds=[10.0, 0.5, 1.5],
                       timed=[False, True, True])
    assert result.tokens_per_s == TINY.batch_size * TINY.seq_len / 1.0, "the median of 0.5 and 1.5"


def test_tokens_per_s_is_not_set_by_one_stalled_step():
    result = RunResult(TINY, "cpu", True, losses=[1.0] * 4, step_seconds=[9.0, 0.5, 8.0, 0.5],
                       timed=[False, True, True, True])
    assert result.tokens_per_s == TINY.batch_size * TINY.seq_len / 0.5


def test_time_to_loss_counts_every_second_until_the_average_reaches_the_target():
    result = RunResult(TINY, "cpu", True, losses=[5.0, 4.0, 3.0, 2.0, 1.0],
                       step_seconds=[3.0, 1.0, 1.0, 1.0, 1.0], timed=[False] + [True] * 4)
    assert result.time_to_loss(3.5, smooth=2) == 5.0, "mean(4, 3) <= 3.5 first at the third step"
    assert result.time_to_loss(5.0, smooth=1) == 3.0
    assert result.time_to_loss(0.5, smooth=1) == math.inf


def test_table_marks_unaccelerated_runs_and_speeds_up_against_fp32():
    fast = RunResult(TINY, "cpu", True, [2.0] * 3, [1.0] * 3, [True] * 3, [1.0] * 3, [], 2.0)
    slow = dataclasses.replace(fast, config=dataclasses.replace(TINY, precision="fp16"),
                               accelerated=False, step_seconds=[4.0] * 3, skipped_steps=[1])
    text = format_table([fast, slow])
    assert "1.00x" in text and "0.25x" in text and "fp16 dynamic-scaling*" in text
    assert "* not accelerated" in text
    html = html_table([fast, slow])
    assert html.startswith("<table") and html.count("<tr>") == 3 and "<td>0.25x</td>" in html


TINY_FLAGS = ["--d-model", "16", "--layers", "1", "--heads", "2", "--batch", "2", "--seq-len", "8",
              "--device", "cpu"]


def test_command_line_train_prints_a_summary_and_resumes(tmp_path, capsys):
    from mpcourse.cli import main
    checkpoint = str(tmp_path / "run.pt")
    assert main(["train", "--precision", "fp16", "--steps", "3", "--checkpoint", checkpoint, *TINY_FLAGS]) == 0
    out = capsys.readouterr().out
    assert "fp16 dynamic-scaling" in out and "3/3" in out and "eval loss" in out
    assert main(["train", "--precision", "fp16", "--steps", "5", "--checkpoint", checkpoint, "--resume",
                 *TINY_FLAGS]) == 0
    assert "5/5" in capsys.readouterr().out
    assert torch.load(checkpoint, weights_only=False)["step"] == 5


def test_command_line_compare_prints_the_table_and_saves_the_curves(tmp_path, capsys):
    from mpcourse.cli import main
    png = tmp_path / "curves.png"
    assert main(["compare", "--precisions", "fp32,bf16", "--steps", "3", "--out", str(png), *TINY_FLAGS]) == 0
    out = capsys.readouterr().out
    assert "speed-up vs fp32" in out and "1.00x" in out and "bf16" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("bf16_speedup, accelerated", [(2.0, True), (0.01, False)])
def test_a_cpu_run_is_accelerated_only_where_the_calibration_says_so(monkeypatch, bf16_speedup, accelerated):
    monkeypatch.setattr(hardware, "measured_probe", lambda: hardware.MatmulProbe(
        256, {"fp32": 1e-3, "bf16": 1e-3 / bf16_speedup, "fp16": 0.1}))
    flags_say_yes = PrecisionSupport(True, True, "avx512_bf16")
    config = dataclasses.replace(TINY, precision="bf16")
    assert config.accelerated(torch.device("cpu"), flags_say_yes) is accelerated
    assert TINY.accelerated(torch.device("cpu"), flags_say_yes), "fp32 is the baseline"
