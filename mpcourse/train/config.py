"""What one training run is: its switches and sizes, and the extension points of its variants."""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import ClassVar, ContextManager

import torch

from mpcourse.machine import hardware
from mpcourse.amp.master import MasterWeightOptimizer
from mpcourse.train.models import GPT, GPTConfig
from mpcourse.numbers.precision import AUTOCAST_DTYPES, RUN_PRECISIONS, PrecisionSupport, autocast_dtype

AUTOCASTS = ("torch", "mpcourse")
LOSS_SCALINGS = ("dynamic", "static", "off")


@dataclass(frozen=True)
class RunConfig:
    """One training run: the precision switches, the sizes, and where to run.

    - `precision`: "fp32"; "tf32" (FP32 with TF32 tensor-core matmuls, CUDA only); "bf16" or
      "fp16" (autocast to that type).
    - `autocast`: whose mechanisms run the recipe: "torch" (`torch.autocast`,
      `torch.amp.GradScaler`) or "mpcourse" (the course's `mpcourse.amp.autocast`, `GradScaler`,
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
    #: Whether the loop adds up the first step's memory off CUDA (by tensor accounting, which
    #: needs each tensor's storage); a variant whose tensors are sharded measures its own.
    cpu_memory_accounting: ClassVar[bool] = True

    def __post_init__(self):
        for name, allowed in (("precision", RUN_PRECISIONS), ("autocast", AUTOCASTS),
                              ("loss_scaling", LOSS_SCALINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of "
                                 f"{', '.join(allowed)}")
        for name in ("steps", "batch_size", "seq_len", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps={self.steps}) (at least one step is "
                             f"timed after the warm-up), got {self.warmup_steps}")
        if self.device != "auto":
            torch.device(self.device)  # raises on a name torch does not know
        self.model_config()  # validates the shape

    def with_steps(self, steps: int) -> "RunConfig":
        """This run with `steps` steps, its warm-up cut to leave at least one timed step (a run of
        1 or 2 steps, shorter than the lab's warm-up, times its last)."""
        return dataclasses.replace(self, steps=steps, warmup_steps=min(self.warmup_steps, steps - 1))

    def model_config(self) -> GPTConfig:
        return GPTConfig(vocab_size=self.vocab_size, seq_len=self.seq_len, d_model=self.d_model,
                         n_layers=self.n_layers, n_heads=self.n_heads)

    @property
    def low_precision(self) -> bool:
        return self.precision in AUTOCAST_DTYPES

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

    def resolved_device(self) -> torch.device:
        if self.device != "auto":
            return torch.device(self.device)
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")

    # The extension points of training variants. A variant (FP8 or block-scaled linears, an
    # optimizer with low-precision state, a model trained on several processes) subclasses
    # RunConfig and overrides what it changes; the one loop in `mpcourse.train.loop`, with its
    # timing, callbacks, memory, checkpoints and time limit, stays the same. A switch a variant
    # cannot honour must raise in its `__post_init__`.

    def prepare_model(self, model: GPT) -> torch.nn.Module:
        """The model to train, made from the lesson's GPT once before the first step."""
        return model

    def make_optimizer(self, model: torch.nn.Module):
        """The optimizer, and the parameters whose gradients are clipped: AdamW on the model's
        parameters, or on FP32 masters of 16-bit parameters (`master_weights`). An optimizer
        variant (lower-precision states, stochastic rounding) overrides this."""
        kwargs = dict(lr=self.lr, betas=(0.9, 0.95), weight_decay=0.0)
        if self.low_precision and self.master_weights:
            model.to(autocast_dtype(self.precision))
            optimizer = MasterWeightOptimizer(model.parameters(), torch.optim.AdamW, **kwargs)
            return optimizer, optimizer.master_parameters()
        return torch.optim.AdamW(model.parameters(), **kwargs), list(model.parameters())

    def local_batch(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The part of each global batch this process trains on: all of it, in one process."""
        return x, y

    def measuring(self, step: int, model: torch.nn.Module, measurements: dict) -> ContextManager:
        """A context around each step's forward and backward, in which a variant may measure
        what the loop does not (e.g. the bytes a multi-process run hands to its collectives),
        recording it in `measurements` (the run's `RunResult.measurements`)."""
        return contextlib.nullcontext()

    def reported_loss(self, loss: torch.Tensor) -> float:
        """The step's loss as the run records it: this process's loss, in one process."""
        return loss.item()

    def accelerated(self, device: torch.device, support: PrecisionSupport) -> bool:
        """Whether the hardware speeds this run's arithmetic up (`support` is its precision's).

        On a CPU a 16-bit precision also needs the calibration's word (`hardware.is_fast`): the
        flags say what the CPU has, not whether torch's kernels use it here.
        """
        if device.type == "cpu" and self.low_precision:
            return support.accelerated and hardware.is_fast(self.precision)
        return support.accelerated


#: The lab's configuration on a CPU that emulates 16-bit formats, and on every CPU the size of
#: lesson 06's recipe and four-precision comparison: even emulated fp16 finishes in seconds.
LESSON_CPU_CONFIG = RunConfig(d_model=32, n_layers=2, n_heads=2, batch_size=8, seq_len=32,
                              steps=120, lr=1e-2)
#: The lab's configuration on a CPU whose bf16 (or fp16) matmuls were measured fast
#: (`mpcourse.train.sizing`): wide enough that matmuls dominate a step, so the speed-up shows, and
#: short enough that fp32 and bf16 runs take seconds each.
LESSON_CPU_MATMUL_CONFIG = RunConfig(d_model=512, n_layers=2, n_heads=8, batch_size=8, seq_len=128,
                                     steps=12, lr=3e-3, warmup_steps=2)
#: The lab's configuration on a CUDA GPU: GPT-2 small's shape (d_model 768, 12 layers, 12
#: heads, 1024 tokens of context), with a 256-token vocabulary.
LESSON_CUDA_CONFIG = RunConfig(d_model=768, n_layers=12, n_heads=12, batch_size=8, seq_len=1024,
                               steps=60, lr=6e-4, warmup_steps=5)
