"""The mixed-precision training loop, with every switch the course teaches (lesson 06).

One iteration is the recipe of lessons 03 to 05, in this order::

    with autocast(device, dtype):           # forward and loss in 16 bits where it is safe
        loss = next_token_loss(model(x), y)
    scaler.scale(loss).backward()           # backward outside autocast, on the scaled loss
    scaler.unscale_(optimizer)              # true gradients, so that clipping sees them
    clip_grad_norm_(params, grad_clip)
    scaler.step(optimizer)                  # skipped if a gradient overflowed
    scaler.update()                         # choose the next scale

`RunConfig` holds the switches (precision, whose autocast and scaler, loss scaling, master
weights) and the sizes; `train` runs one configuration and measures it honestly (warm-up steps
excluded, the device synchronized around every timed step, peak memory reset per run);
`compare` runs several on the same data and tabulates them. A run can be checkpointed and
resumed, and Ctrl-C saves a checkpoint before it stops.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch

from mpcourse import hardware
from mpcourse.benchmark import synchronize
from mpcourse.data import Batches, MarkovText
from mpcourse.autocast import autocast as mpcourse_autocast
from mpcourse.master import MasterWeightOptimizer
from mpcourse.memory import measure_peak_memory
from mpcourse.models import GPT, GPTConfig, next_token_loss
from mpcourse.scaling import GradScaler, StaticLossScaler

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
AUTOCASTS = ("torch", "mpcourse")
LOSS_SCALINGS = ("dynamic", "static", "off")
LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


class UnacceleratedPrecisionWarning(UserWarning):
    """The precision runs on this device, but without hardware that makes it fast."""


@dataclass(frozen=True)
class RunConfig:
    """One training run: the precision switches, the sizes, and where to run.

    - `precision`: "fp32"; "tf32" (FP32 with TF32 tensor-core matmuls, CUDA only); "bf16" or
      "fp16" (autocast to that type).
    - `autocast`: whose mechanisms run the recipe: "torch" (`torch.autocast`,
      `torch.amp.GradScaler`) or "mpcourse" (the course's `mpcourse.autocast`, `GradScaler`,
      `StaticLossScaler`). Their results agree; the second is slower, being Python.
    - `loss_scaling`: "dynamic" (GradScaler), "static" (a fixed `static_scale`) or "off".
    - `master_weights`: for bf16/fp16, keep the model's parameters in 16 bits with FP32 masters
      (`MasterWeightOptimizer`) instead of FP32 parameters under autocast. FP32 and TF32
      parameters are their own masters, so for them the flag changes nothing.
    - `warmup_steps`: the first steps, excluded from timing (allocation, kernel selection).
    - `time_limit_s`: stop early after this many seconds (see `fit_to_hardware`).
    - `device`: "auto" picks CUDA, then Apple's MPS, then the CPU.
    """
    precision: str = "fp32"
    autocast: str = "torch"
    loss_scaling: str = "dynamic"
    master_weights: bool = False
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 256
    batch_size: int = 8
    seq_len: int = 32
    steps: int = 100
    lr: float = 3e-3
    grad_clip: float | None = 1.0
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    static_scale: float = 2.0**10
    warmup_steps: int = 2
    eval_batches: int = 4
    time_limit_s: float | None = None
    device: str = "auto"
    seed: int = 0

    def __post_init__(self):
        for name, allowed in (("precision", PRECISIONS), ("autocast", AUTOCASTS),
                              ("loss_scaling", LOSS_SCALINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of "
                                 f"{', '.join(allowed)}")
        for name in ("steps", "batch_size", "seq_len", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps={self.steps}), got {self.warmup_steps}")
        if self.device != "auto":
            torch.device(self.device)  # raises on a name torch does not know
        self.model_config()  # validates the shape

    def model_config(self) -> GPTConfig:
        return GPTConfig(vocab_size=self.vocab_size, seq_len=self.seq_len, d_model=self.d_model,
                         n_layers=self.n_layers, n_heads=self.n_heads)

    @property
    def low_precision(self) -> bool:
        return self.precision in LOW_PRECISION

    @property
    def label(self) -> str:
        """A short name for tables and plots, e.g. "fp16 dynamic-scaling master" or "bf16"."""
        parts = [self.precision]
        if self.low_precision and self.loss_scaling != "off":
            parts.append(f"{self.loss_scaling}-scaling")
        if self.low_precision and self.master_weights:
            parts.append("master")
        if self.autocast == "mpcourse":
            parts.append("(mpcourse)")
        return " ".join(parts)

    # The extension point for training variants. A variant (FP8 or block-scaled linears, a
    # model wrapped for several processes, an optimizer with low-precision state) subclasses
    # RunConfig and overrides `prepare_model`, `make_optimizer` or `accelerated`; the one loop
    # in `train`, with its timing, callbacks, memory, checkpoints and time limit, stays the same.
    # A switch a variant cannot honour must raise in its `__post_init__`.

    def prepare_model(self, model: GPT) -> torch.nn.Module:
        """The model to train, made from the lesson's GPT once before the first step."""
        return model

    def make_optimizer(self, model: torch.nn.Module):
        """The optimizer, and the parameters whose gradients are clipped: AdamW on the model's
        parameters, or on FP32 masters of 16-bit parameters (`master_weights`). An optimizer
        variant (lower-precision states, stochastic rounding) overrides this."""
        kwargs = dict(lr=self.lr, betas=(0.9, 0.95), weight_decay=0.0)
        if self.low_precision and self.master_weights:
            model.to(LOW_PRECISION[self.precision])
            optimizer = MasterWeightOptimizer(model.parameters(), torch.optim.AdamW, **kwargs)
            return optimizer, optimizer.master_parameters()
        return torch.optim.AdamW(model.parameters(), **kwargs), list(model.parameters())

    def accelerated(self, device: torch.device, support: hardware.PrecisionSupport) -> bool:
        """Whether the hardware speeds this run's arithmetic up (`support` is its precision's).

        On a CPU a 16-bit precision also needs the calibration's word (`hardware.is_fast`): the
        flags say what the CPU has, not whether torch's kernels use it here.
        """
        if device.type == "cpu" and self.low_precision:
            return support.accelerated and hardware.is_fast(self.precision)
        return support.accelerated

    def resolved_device(self) -> torch.device:
        if self.device != "auto":
            return torch.device(self.device)
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")


#: The lab's configuration on a CPU that emulates 16-bit formats, and on every CPU the size of
#: lesson 06's recipe and four-precision comparison: even emulated fp16 finishes in seconds.
LESSON_CPU_CONFIG = RunConfig(d_model=32, n_layers=2, n_heads=2, batch_size=8, seq_len=32,
                              steps=120, lr=1e-2)
#: The lab's configuration on a CPU whose bf16 (or fp16) matmuls were measured fast
#: (`mpcourse.lab_size`): wide enough that matmuls dominate a step, so the speed-up shows, and
#: short enough that fp32 and bf16 runs take seconds each.
LESSON_CPU_MATMUL_CONFIG = RunConfig(d_model=512, n_layers=2, n_heads=8, batch_size=8, seq_len=128,
                                     steps=12, lr=3e-3, warmup_steps=2)
#: The lab's configuration on a CUDA GPU: GPT-2 small's shape (d_model 768, 12 layers, 12
#: heads, 1024 tokens of context), with a 256-token vocabulary.
LESSON_CUDA_CONFIG = RunConfig(d_model=768, n_layers=12, n_heads=12, batch_size=8, seq_len=1024,
                               steps=60, lr=6e-4, warmup_steps=5)


@dataclass(frozen=True)
class StepInfo:
    """What a callback hears after each training step."""
    step: int          # 0-based index of the step just finished
    steps: int         # steps in the run
    loss: float
    seconds: float
    tokens_per_s: float
    scale: float       # the loss scale this step used (1.0 without scaling)
    skipped: bool      # the scaler skipped the optimizer step (a gradient overflowed)


@dataclass
class RunResult:
    """Everything one run measured. Losses are per step, in nats per token."""
    config: RunConfig
    device: str
    accelerated: bool                 # whether the hardware speeds this precision up
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    timed: list[bool] = field(default_factory=list)   # False for warm-up steps
    scales: list[float] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    eval_loss: float = math.nan
    peak_memory_bytes: int = 0
    memory_measured_by: str = ""
    stopped_early: bool = False

    @property
    def steps_done(self) -> int:
        return len(self.losses)

    @property
    def tokens_per_s(self) -> float:
        """Training throughput of a typical step: its tokens over the median timed step (warm-up
        excluded). The median, because other work on the machine can only make a step slower,
        and one stalled step should not set the figure."""
        timed = [s for s, t in zip(self.step_seconds, self.timed) if t]
        if not timed or statistics.median(timed) == 0:
            return math.nan
        return self.config.batch_size * self.config.seq_len / statistics.median(timed)

    def time_to_loss(self, target: float, smooth: int = 10) -> float:
        """Training seconds (warm-up included) until the mean loss of the last `smooth` steps
        first reaches `target`; inf if it never does. Unlike tokens/s, this also charges a
        precision for learning less per step."""
        for end in range(smooth, len(self.losses) + 1):
            if sum(self.losses[end - smooth:end]) / smooth <= target:
                return sum(self.step_seconds[:end])
        return math.inf

    @property
    def final_loss(self) -> float:
        """The mean training loss over the last 10% of the steps (at least one)."""
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail)


Callback = Callable[[StepInfo], None]


def precision_support(precision: str, device_type: str) -> hardware.PrecisionSupport:
    """Check that `precision` can run on `device_type`; warn when it runs without acceleration.

    Raises ValueError for a precision the device cannot run (e.g. bf16 on a GPU older than
    Ampere). TF32 off CUDA is the one documented fallback: it runs as plain FP32, with a warning.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    support = _device_precisions(device_type)[precision]
    if precision == "tf32" and device_type != "cuda":
        warnings.warn(f"tf32 is an NVIDIA tensor-core mode; on {device_type} it runs as plain "
                      "fp32", UnacceleratedPrecisionWarning, stacklevel=3)
        return support
    if not support.supported:
        raise ValueError(f"precision {precision!r} cannot run on this {device_type} device: "
                         f"{support.how}. Choose one of: " + ", ".join(
                             p for p in PRECISIONS if _device_precisions(device_type)[p].supported))
    if not support.accelerated:
        warnings.warn(f"{precision} on this {device_type} is not accelerated ({support.how}); "
                      "expect it to be slower than fp32", UnacceleratedPrecisionWarning, stacklevel=3)
    return support


def _device_precisions(device_type: str) -> dict[str, hardware.PrecisionSupport]:
    report = hardware.report()
    if report.device_type == device_type:
        return report.precisions
    if device_type == "cpu":  # asked for the CPU on a machine that also has a GPU
        return hardware.cpu_precisions(hardware.cpu_flags())
    raise ValueError(f"device {device_type!r} is not available here (found {report.device_type})")


def fit_to_hardware(config: RunConfig, seconds: float = 20.0) -> RunConfig:
    """The config, with a time limit when its precision is not accelerated on its device.

    On a CPU without native fp16 arithmetic an fp16 step can take tens of times longer than an
    fp32 step; rather than wait minutes, such a run stops after `seconds` and says so. On a CPU
    a 16-bit precision counts as accelerated only if the calibration also measured it fast
    (`hardware.is_fast`): flags promise nothing when torch's kernels do not use them.
    """
    device_type = config.resolved_device().type
    support = _device_precisions(device_type)[config.precision]
    if support.accelerated and (device_type != "cpu" or hardware.is_fast(config.precision)):
        return config
    return dataclasses.replace(config, time_limit_s=seconds)


def train(config: RunConfig, callbacks: Iterable[Callback] = (), *,
          checkpoint_path: str | Path | None = None, resume: bool = False) -> RunResult:
    """Train the lesson's GPT with `config`, calling each callback after every step.

    With `checkpoint_path`, the run saves a checkpoint there when it ends, and also when it is
    interrupted (Ctrl-C, i.e. KeyboardInterrupt, which is then re-raised). With `resume=True`
    it continues from that checkpoint: the continued run's losses equal, bit for bit on the CPU,
    those of a run that was never interrupted.
    """
    device = config.resolved_device()
    support = precision_support(config.precision, device.type)
    callbacks = list(callbacks)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    text = MarkovText(config.vocab_size, seed=config.seed)
    batches = Batches(text, config.batch_size, config.seq_len, seed=config.seed, device=device)
    eval_batches = Batches(text, config.batch_size, config.seq_len, seed=config.seed + 1,
                           device=device)
    model = config.prepare_model(GPT(config.model_config()).to(device))
    optimizer, parameters = config.make_optimizer(model)
    scaler = _scaler(config, device.type)
    result = RunResult(config, device.type, config.accelerated(device, support))
    start_step = 0
    if resume:
        start_step = _load_checkpoint(checkpoint_path, config, model, optimizer, scaler, result)

    started = time.perf_counter()
    try:
        with _matmul_precision(config.precision, device.type):
            for step in range(start_step, config.steps):
                x, y = batches.get(step)
                scale = scaler.get_scale() if scaler.is_enabled() else 1.0
                outcome = []
                run_step = lambda: outcome.extend(  # noqa: E731
                    _train_step(model, optimizer, parameters, scaler, x, y, config))
                synchronize(device)
                begin = time.perf_counter()
                if step == start_step and device.type != "cuda":
                    peak = measure_peak_memory(run_step, model=model, optimizer=optimizer)
                    _record_cpu_memory(result, peak, model, optimizer)
                else:
                    run_step()
                synchronize(device)
                seconds = time.perf_counter() - begin
                loss, grad_norm = outcome
                info = StepInfo(step, config.steps, loss, seconds,
                                config.batch_size * config.seq_len / seconds, scale,
                                skipped=scaler.is_enabled() and not math.isfinite(grad_norm))
                _record(result, info, timed=step >= start_step + config.warmup_steps)
                for callback in callbacks:
                    callback(info)
                out_of_time = (config.time_limit_s is not None
                               and time.perf_counter() - started > config.time_limit_s)
                if out_of_time and step + 1 < config.steps:
                    result.stopped_early = True
                    break
            result.eval_loss = _evaluate(model, eval_batches, config, device.type)
    except KeyboardInterrupt:
        if checkpoint_path is not None:
            _save_checkpoint(checkpoint_path, model, optimizer, scaler, result)
        raise
    if device.type == "cuda":
        result.peak_memory_bytes = torch.cuda.max_memory_allocated(device)
        result.memory_measured_by = "CUDA caching allocator: peak over the run"
    if checkpoint_path is not None:
        _save_checkpoint(checkpoint_path, model, optimizer, scaler, result)
    return result


def _train_step(model, optimizer, parameters, scaler, x, y, config: RunConfig):
    """One iteration of the recipe; returns the loss and the (unscaled) gradient norm."""
    with _autocast(config, x.device.type):
        loss = next_token_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, config.grad_clip or math.inf)
    scaler.step(optimizer)
    if config.loss_scaling == "static" and isinstance(scaler, torch.amp.GradScaler):
        scaler.update(new_scale=config.static_scale)  # torch has no static scaler: pin the scale
    else:
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.item(), grad_norm.item()


def _autocast(config: RunConfig, device_type: str):
    if not config.low_precision:
        return contextlib.nullcontext()
    implementation = torch.autocast if config.autocast == "torch" else mpcourse_autocast
    return implementation(device_type, dtype=LOW_PRECISION[config.precision])


@contextlib.contextmanager
def _matmul_precision(precision: str, device_type: str):
    """TF32 matmuls on CUDA for "tf32" only; every other run gets true FP32 matmuls."""
    if device_type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _scaler(config: RunConfig, device_type: str):
    enabled = config.loss_scaling != "off"
    if config.autocast == "torch":
        init_scale = config.static_scale if config.loss_scaling == "static" else config.init_scale
        return torch.amp.GradScaler(device_type, init_scale=init_scale,
                                    growth_interval=config.growth_interval, enabled=enabled)
    if config.loss_scaling == "static":
        return StaticLossScaler(config.static_scale)
    return GradScaler(config.init_scale, growth_interval=config.growth_interval, enabled=enabled)


def _record(result: RunResult, info: StepInfo, timed: bool) -> None:
    result.losses.append(info.loss)
    result.step_seconds.append(info.seconds)
    result.timed.append(timed)
    result.scales.append(info.scale)
    if info.skipped:
        result.skipped_steps.append(info.step)


def _record_cpu_memory(result: RunResult, peak, model: GPT, optimizer) -> None:
    """The CPU has no allocator counter: add up what the step held at its peak.

    `peak` saw the parameters, the optimizer state and the most bytes saved for backward at
    once; the gradients (freed by `zero_grad` before it looked) and the FP32 masters with their
    gradients are added here.
    """
    gradients = sum(p.nbytes for p in model.parameters())
    masters = optimizer.master_parameters() if isinstance(optimizer, MasterWeightOptimizer) else []
    result.peak_memory_bytes = peak.peak + gradients + sum(2 * m.nbytes for m in masters)
    result.memory_measured_by = ("tensor accounting on the first step: parameters, gradients, "
                                 "optimizer state, FP32 masters, and the most bytes saved for "
                                 "backward at once")


@torch.no_grad()
def _evaluate(model: GPT, batches: Batches, config: RunConfig, device_type: str) -> float:
    """Mean loss on held-out batches, computed the way the run computes its forward pass."""
    losses = []
    for i in range(config.eval_batches):
        x, y = batches.get(i)
        with _autocast(config, device_type):
            losses.append(next_token_loss(model(x), y).item())
    return sum(losses) / len(losses)


_HISTORY = ("losses", "step_seconds", "timed", "scales", "skipped_steps")
_MAY_DIFFER_ON_RESUME = ("steps", "time_limit_s")


def _save_checkpoint(path: str | Path, model: GPT, optimizer, scaler, result: RunResult) -> None:
    """Everything a resumed run needs to continue bit for bit, written atomically."""
    state = {
        "config": dataclasses.asdict(result.config),
        "step": result.steps_done,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "history": {name: getattr(result, name) for name in _HISTORY},
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
    }
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    partial.replace(path)  # a second Ctrl-C during the save cannot leave a broken checkpoint


def _load_checkpoint(path: str | Path | None, config: RunConfig, model: GPT, optimizer, scaler,
                     result: RunResult) -> int:
    """Restore a checkpoint saved by `train`; return the step to continue from."""
    if path is None:
        raise ValueError("resume=True needs a checkpoint_path to resume from")
    if not Path(path).exists():
        raise FileNotFoundError(f"no checkpoint to resume from at {path}")
    state = torch.load(path, map_location=result.device, weights_only=False)
    saved, wanted = state["config"], dataclasses.asdict(config)
    different = [name for name in wanted if name not in _MAY_DIFFER_ON_RESUME
                 and saved.get(name) != wanted[name]]
    if different:
        raise ValueError(f"checkpoint {path} was saved by a different configuration: "
                         + ", ".join(f"{n}={saved.get(n)!r} there, {wanted[n]!r} here" for n in different))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler.is_enabled():
        scaler.load_state_dict(state["scaler"])
    for name in _HISTORY:
        setattr(result, name, list(state["history"][name]))
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"]:
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state["step"]


def compare(configs: Iterable[RunConfig], callbacks: Iterable[Callback] = ()) -> "RunComparison":
    """Run each configuration in turn, on the same data, and collect the results."""
    callbacks = list(callbacks)
    return RunComparison([train(config, callbacks) for config in configs])


@dataclass
class RunComparison:
    """Runs side by side: `str()` is the table, `html()` the same as an HTML table, `plot()`."""
    results: list[RunResult]

    def rows(self) -> list[dict[str, str]]:
        return table_rows(self.results)

    def __str__(self) -> str:
        return format_table(self.results)

    def html(self) -> str:
        return html_table(self.results)

    def plot(self, ax=None):
        return plot_losses(self.results, ax=ax)


UNACCELERATED_MARK = "*"
STOPPED_MARK = "+"
TABLE_NOTES = {
    UNACCELERATED_MARK: "not accelerated on this device (emulated or unaccelerated path): "
                        "not the speed this precision has on hardware built for it",
    STOPPED_MARK: "stopped early at its time limit (fewer steps: its losses are not comparable)",
}


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
    from html import escape
    rows = table_rows(results)
    columns = list(rows[0]) if rows else ["run"]
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(row[c])}</td>" for c in columns) + "</tr>"
                   for row in rows)
    notes = "".join(f"<p><small>{escape(note)}</small></p>" for note in _notes(results))
    return (f'<table class="mpcourse-results"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>{notes}")


def plot_losses(results: list[RunResult], ax=None, smooth: int = 10):
    """Training-loss curves of the runs (moving average over `smooth` steps), with the floor."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        losses = torch.tensor(r.losses, dtype=torch.float64)
        window = max(1, min(smooth, len(losses) // 2))  # a short run still draws a line
        averaged = losses.unfold(0, window, 1).mean(dim=1) if len(losses) else losses
        ax.plot(range(window, window + len(averaged)), averaged, label=r.config.label)
    if results:
        config = results[0].config
        floor = MarkovText(config.vocab_size, seed=config.seed).entropy_rate
        ax.axhline(floor, color="gray", linestyle="--", linewidth=1,
                   label=f"best possible ({floor:.2f} nats)")
    ax.set_xlabel("training step")
    ax.set_ylabel(f"training loss (nats/token, mean of {smooth} steps)")
    ax.set_title("Loss curves")
    ax.legend(fontsize="small")
    return ax.figure
