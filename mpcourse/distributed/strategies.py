"""The two ways lesson 08 trains across processes, and the run variant that plugs them into
the one training loop.

- **DDP** keeps a full FP32 replica per rank and all-reduces the gradients after backward.
  PyTorch's `fp16_compress_hook` and `bf16_compress_hook` cast each gradient bucket to 16 bits
  before the all-reduce and back after it: half the bytes on the wire, one more rounding.
- **FSDP2** (`fully_shard`) keeps only a shard of each FP32 parameter per rank. Its
  `MixedPrecisionPolicy(param_dtype, reduce_dtype)` says in which dtype the parameters are
  all-gathered and computed with (`param_dtype`) and in which the gradients are
  reduce-scattered (`reduce_dtype`). The sharded FP32 parameters are the master weights.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from mpcourse.distributed.collectives import CollectiveCounter
from mpcourse.train.models import GPT
from mpcourse.numbers.precision import AUTOCAST_DTYPES, RUN_PRECISIONS, dtype_name
from mpcourse.train import RunConfig

STRATEGIES = ("ddp", "fsdp2")
COMPRESSIONS = ("none", "fp16", "bf16")
#: Dtypes a sharding policy may use: FSDP2 computes and reduces in these.
POLICY_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class DistributedRun:
    """One way to train across processes.

    - `strategy="ddp"`: replicated FP32 model; `compress` is "none" (FP32 all-reduce), "fp16"
      or "bf16" (PyTorch's `fp16_compress_hook` / `bf16_compress_hook`).
    - `strategy="fsdp2"`: each transformer block and the whole model `fully_shard`-ed with
      `MixedPrecisionPolicy(param_dtype, reduce_dtype)`.
    """
    strategy: str = "ddp"
    compress: str = "none"
    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype = torch.float32

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.compress not in COMPRESSIONS:
            raise ValueError(f"unknown compress {self.compress!r}; choose one of {', '.join(COMPRESSIONS)}")
        if self.strategy == "fsdp2" and self.compress != "none":
            raise ValueError("compress hooks belong to DDP; FSDP2 sets its gradient dtype with reduce_dtype")
        if self.strategy == "fsdp2":
            sharding_policy(self.param_dtype, self.reduce_dtype)  # validates the dtypes

    @property
    def gradient_dtype(self) -> torch.dtype:
        """The dtype gradients travel in: the compress hook's (DDP) or `reduce_dtype` (FSDP2)."""
        if self.strategy == "fsdp2":
            return self.reduce_dtype
        return torch.float32 if self.compress == "none" else AUTOCAST_DTYPES[self.compress]

    @property
    def wire_dtypes(self) -> dict[str, torch.dtype]:
        """The dtype each collective carries: DDP's all-reduce in FP32 or its hook's 16 bits,
        FSDP2's all-gathers in `param_dtype` and its reduce-scatters in `reduce_dtype`."""
        if self.strategy == "ddp":
            return {"all_reduce": self.gradient_dtype}
        return {"all_gather": self.param_dtype, "reduce_scatter": self.reduce_dtype}

    def fitted(self, config: RunConfig) -> RunConfig:
        """`config` with the switches this run decides itself: FSDP2's policy sets the compute
        precision, so its runs keep `precision="fp32"` and no loss scaler."""
        if self.strategy == "fsdp2":
            return dataclasses.replace(config, precision="fp32", loss_scaling="off")
        return config

    @property
    def label(self) -> str:
        if self.strategy == "ddp":
            return "DDP fp32 all-reduce" if self.compress == "none" else f"DDP {self.compress} compress hook"
        return f"FSDP2 param {dtype_name(self.param_dtype)}, reduce {dtype_name(self.reduce_dtype)}"

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "compress": self.compress,
                "param_dtype": dtype_name(self.param_dtype), "reduce_dtype": dtype_name(self.reduce_dtype)}

    @classmethod
    def from_json(cls, d: dict) -> "DistributedRun":
        return cls(d["strategy"], d["compress"], getattr(torch, d["param_dtype"]),
                   getattr(torch, d["reduce_dtype"]))


def sharding_policy(param_dtype: torch.dtype = torch.bfloat16,
                    reduce_dtype: torch.dtype = torch.float32):
    """FSDP2's `MixedPrecisionPolicy`, after checking both dtypes are ones FSDP2 can compute in."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    for name, dtype in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
        if dtype not in POLICY_DTYPES:
            raise ValueError(f"unsupported {name} {dtype!r} for an FSDP2 policy; choose one of "
                             + ", ".join(map(str, POLICY_DTYPES)))
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def compress_hook(compress: str):
    """PyTorch's DDP communication hook for `compress`, or None for the plain FP32 all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    hooks = {"none": None, "fp16": default_hooks.fp16_compress_hook,
             "bf16": default_hooks.bf16_compress_hook}
    if compress not in hooks:
        raise ValueError(f"unknown compress {compress!r}; choose one of {', '.join(hooks)}")
    if compress == "bf16" and not torch.cuda.is_available():
        return _bf16_compress_hook_for_gloo
    return hooks[compress]


def _bf16_compress_hook_for_gloo(process_group, bucket):
    """Exactly `bf16_compress_hook`, under another name.

    DDP refuses a hook *named* bf16_compress_hook unless torch was built with CUDA and NCCL
    2.10+, a rule written for NCCL. Gloo all-reduces bfloat16 too, so on a CPU we register
    the same function through this wrapper.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks.bf16_compress_hook(process_group, bucket)


def run_for_precision(precision: str) -> DistributedRun:
    """The run `mpcourse train --nproc N --precision P` starts.

    FP32 (and TF32) train with DDP and an FP32 all-reduce. BF16 and FP16 train the way
    distributed mixed precision is usually done: FSDP2 with `param_dtype` set to that type and
    `reduce_dtype=torch.float32`.
    """
    if precision not in RUN_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(RUN_PRECISIONS)}")
    if precision not in AUTOCAST_DTYPES:
        return DistributedRun("ddp")
    return DistributedRun("fsdp2", param_dtype=AUTOCAST_DTYPES[precision], reduce_dtype=torch.float32)


@dataclass(frozen=True)
class DistributedRunConfig(RunConfig):
    """A run on every process of a torchrun launch: the lesson's model wrapped by `run`'s
    strategy, each process training on its share of every global batch.

    The one training loop runs unchanged in each process. Each loss it records is the mean
    over all processes, so the run computes what one process computes on the whole batch, up
    to rounding. Switches a multi-process run cannot honour here raise: a time limit (each
    process would stop at its own step and leave the others waiting in a collective), master
    weights (FSDP2's sharded FP32 parameters are the masters; DDP uses FP32 parameters under
    autocast), the course's Python autocast, and, for FSDP2, autocast and loss scaling (its
    policy's `param_dtype` sets the compute precision).
    """
    run: DistributedRun = DistributedRun()
    cpu_memory_accounting = False  # FSDP2's parameters are DTensors; `measuring` counts per rank

    def __post_init__(self):
        super().__post_init__()
        refusals = {
            "time_limit_s": (self.time_limit_s is not None,
                             "each process would stop at its own step; use fewer steps"),
            "master_weights": (self.master_weights, "FSDP2's FP32 shards are the master weights; "
                               "for DDP keep FP32 parameters and use autocast"),
            "autocast": (self.autocast != "torch", "the multi-process runs use torch's autocast"),
        }
        if self.run.strategy == "fsdp2":
            refusals["precision"] = (self.precision != "fp32", "FSDP2 computes in its policy's "
                                     "param_dtype; keep precision='fp32' and set the run's param_dtype")
            refusals["loss_scaling"] = (self.loss_scaling != "off", "the course runs FSDP2 without "
                                        "a loss scaler; set loss_scaling='off'")
        for name, (refused, why) in refusals.items():
            if refused:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported by a "
                                 f"{self.run.label} run: {why}")

    @property
    def label(self) -> str:
        return f"{self.run.label} ({super().label})"

    def prepare_model(self, model: GPT) -> torch.nn.Module:
        device = next(model.parameters()).device
        if self.run.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
            hook = compress_hook(self.run.compress)
            if hook is not None:
                ddp.register_comm_hook(None, hook)
            return ddp
        from torch.distributed.fsdp import fully_shard
        policy = sharding_policy(self.run.param_dtype, self.run.reduce_dtype)
        for block in model.blocks:   # one all-gather per block: only one block is ever unsharded
            fully_shard(block, mp_policy=policy)
        return fully_shard(model, mp_policy=policy)

    def local_batch(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.distributed as dist
        rank, world = dist.get_rank(), dist.get_world_size()
        if self.batch_size % world:
            raise ValueError(f"batch_size={self.batch_size} must split evenly over {world} processes")
        rows = slice(rank * self.batch_size // world, (rank + 1) * self.batch_size // world)
        return x[rows], y[rows]

    @contextlib.contextmanager
    def measuring(self, step: int, model: torch.nn.Module, measurements: dict):
        """On the first step: the bytes this rank hands to each collective during forward and
        backward, the bytes of the parameters and gradients it stores after backward, and the
        dtype each module of the first block (one FSDP2 unit) returned in the forward pass."""
        if "bytes_per_step" in measurements:
            yield
            return
        unit_dtypes: dict[str, str] = {}
        unit = getattr(model, "module", model).blocks[0]   # DDP wraps the model; FSDP2 does not
        hooks = [module.register_forward_hook(_dtype_recorder(name, unit_dtypes))
                 for name, module in unit.named_modules() if name]
        try:
            with CollectiveCounter() as counter:
                yield
        finally:
            for hook in hooks:
                hook.remove()
        measurements.update(
            unit_output_dtypes=unit_dtypes,
            bytes_per_step=counter.bytes, largest_gathered_bytes=counter.largest_gathered_bytes,
            param_bytes=sum(_local(p).nbytes for p in model.parameters()),
            grad_bytes=sum(_local(p.grad).nbytes for p in model.parameters() if p.grad is not None))

    def reported_loss(self, loss: torch.Tensor) -> float:
        """The mean of all processes' losses: the loss of the whole global batch."""
        import torch.distributed as dist
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total.item() / dist.get_world_size()


def _dtype_recorder(name: str, seen: dict[str, str]):
    """A forward hook that records, once, the dtype of the tensor module `name` returns."""
    def record(module, args, output):
        if isinstance(output, torch.Tensor):
            seen.setdefault(name, dtype_name(output.dtype))
    return record


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of a (possibly sharded, DTensor) tensor this rank stores."""
    return t.to_local() if hasattr(t, "to_local") else t
