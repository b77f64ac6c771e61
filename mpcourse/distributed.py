"""Mixed precision across processes: DDP gradient compression and FSDP2 precision policies.

Two places where precision matters once training spans several processes:

- **DDP** keeps a full FP32 replica per rank and all-reduces the gradients after backward.
  PyTorch's `fp16_compress_hook` and `bf16_compress_hook` cast each gradient bucket to 16 bits
  before the all-reduce and back after it: half the bytes on the wire, one more rounding.
- **FSDP2** (`fully_shard`) keeps only a shard of each FP32 parameter per rank. Its
  `MixedPrecisionPolicy(param_dtype, reduce_dtype)` says in which dtype the parameters are
  all-gathered and computed with (`param_dtype`) and in which the gradients are
  reduce-scattered (`reduce_dtype`). The sharded FP32 parameters are the master weights.

`launch(runs, config, nproc)` starts `nproc` local processes through `torchrun` (gloo on a
CPU, NCCL on GPUs), trains the lesson-06 GPT once per run, and brings back the losses, the
bytes each collective carried (counted by `CollectiveCounter` as they are handed to the
process group) and the parameter and gradient memory each rank holds.

The global batch is split evenly across ranks and every loss is averaged over all ranks, so a
distributed run computes what single-process training on the whole batch computes
(`train_single_process`), up to rounding. The runs do not clip gradients, so the two stay
comparable step by step.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mpcourse.data import Batches, MarkovText
from mpcourse.models import GPT, next_token_loss
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
    def label(self) -> str:
        if self.strategy == "ddp":
            return "DDP fp32 all-reduce" if self.compress == "none" else f"DDP {self.compress} compress hook"
        return f"FSDP2 param {_name(self.param_dtype)}, reduce {_name(self.reduce_dtype)}"

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "compress": self.compress,
                "param_dtype": _name(self.param_dtype), "reduce_dtype": _name(self.reduce_dtype)}

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


class CollectiveCounter(TorchDispatchMode):
    """Counts the bytes this rank hands to each collective while the mode is active.

    Every collective, from Python (DDP's hooks, FSDP2) or from DDP's C++ reducer, reaches the
    process group through a `c10d` operator, which a dispatch mode sees with its tensors.
    The payload counted is the tensor this rank contributes: the whole buffer for an
    all-reduce and a reduce-scatter, its own shard for an all-gather.
    """

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = {}
        self.largest_gathered_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("c10d::"):
            kind, payload = _collective_payload(name.removeprefix("c10d::").split(".")[0], args)
            self.bytes[kind] = self.bytes.get(kind, 0) + payload
            if kind == "all_gather":
                self.largest_gathered_bytes = max(self.largest_gathered_bytes, _nbytes(args[0]))
        return func(*args, **(kwargs or {}))


def _collective_payload(op: str, args) -> tuple[str, int]:
    if op.startswith("allreduce"):
        return "all_reduce", _nbytes(args[0])
    if op.startswith(("_allgather_base", "allgather_into_tensor")):
        return "all_gather", _nbytes(args[1])
    if op.startswith(("_reduce_scatter_base", "reduce_scatter_tensor")):
        return "reduce_scatter", _nbytes(args[1])
    return op, _nbytes(args[0])


def _nbytes(tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.nbytes
    return sum(_nbytes(t) for t in tensors)


@dataclass
class DistributedResult:
    """What one run measured. Bytes are per rank; losses are the global (all-rank) mean per step."""
    run: DistributedRun
    world_size: int
    backend: str
    losses: list[float] = field(default_factory=list)
    bytes_per_step: dict[str, int] = field(default_factory=dict)   # collective -> bytes, step 1
    param_bytes: list[int] = field(default_factory=list)           # per rank, parameters it stores
    grad_bytes: list[int] = field(default_factory=list)            # per rank, gradients it stores
    largest_gathered_bytes: int = 0    # the biggest unsharded parameter group an all-gather made

    @property
    def gradient_bytes_per_step(self) -> int:
        """Bytes of gradients this rank sent per step (all-reduce for DDP, reduce-scatter for FSDP2)."""
        return self.bytes_per_step.get("all_reduce", 0) + self.bytes_per_step.get("reduce_scatter", 0)


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds for the model's state (activations not included)."""
    parameters: int        # the stored (FP32) parameters: a full replica, or this rank's shard
    gradients: int         # their FP32 gradients
    optimizer: int         # AdamW's two FP32 moments per stored parameter
    gathered: int          # FSDP2 only, while a unit computes: its all-gathered parameters in param_dtype
    reduce_buffer: int     # FSDP2 only, while a unit's gradients are reduce-scattered: in reduce_dtype

    @property
    def persistent(self) -> int:
        return self.parameters + self.gradients + self.optimizer

    @property
    def peak(self) -> int:
        """Persistent state plus one unit's gathered parameters and gradient buffer."""
        return self.persistent + self.gathered + self.reduce_buffer


def memory_per_rank(strategy: str, num_parameters: int, world_size: int, largest_unit: int = 0,
                    param_dtype: torch.dtype = torch.float32,
                    reduce_dtype: torch.dtype = torch.float32) -> RankMemory:
    """What each rank holds for a model of `num_parameters` FP32 parameters trained with AdamW.

    DDP replicates everything. FSDP2 stores 1/world_size of the parameters, gradients and
    optimizer state (FP32 whatever the policy: the shards are the master weights) and, while
    one unit of `largest_unit` parameters computes, its all-gathered copy in `param_dtype` and
    its gradients in `reduce_dtype` on their way to the reduce-scatter.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    check = {"num_parameters": num_parameters, "world_size": world_size}
    for name, value in check.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if strategy == "ddp":
        return RankMemory(4 * num_parameters, 4 * num_parameters, 8 * num_parameters, 0, 0)
    sharding_policy(param_dtype, reduce_dtype)  # validates the dtypes
    shard = -(-num_parameters // world_size)    # ceil: FSDP2 pads the last shard
    return RankMemory(4 * shard, 4 * shard, 8 * shard, largest_unit * param_dtype.itemsize,
                      largest_unit * reduce_dtype.itemsize)


def simulated_reduce(gradients: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The average of the ranks' gradients as a reduction in `dtype` computes it, in float32.

    As in PyTorch's compress hooks, each rank's gradient is cast to `dtype` and divided by the
    number of ranks first (so the sum cannot overflow); the shares are then added one rank
    after another in `dtype`, the order of a ring reduction. It shows, without launching
    anything, how the error of a 16-bit reduction grows with the number of ranks.
    """
    world_size = len(gradients)
    total = gradients[0].to(dtype) / world_size
    for gradient in gradients[1:]:
        total = total + gradient.to(dtype) / world_size
    return total.float()


def check_nproc(nproc: int, device_type: str | None = None) -> int:
    """Check that `nproc` processes fit this machine: one per GPU with CUDA, one per CPU without."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive integer, got {nproc!r}")
    if device_type == "cuda":
        available, what = torch.cuda.device_count(), "CUDA GPUs"
    else:
        available, what = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1), "CPUs"
    if nproc > available:
        raise ValueError(f"nproc={nproc} is more processes than this machine has {what} ({available}); "
                         f"use at most {available}")
    return nproc


def torchrun_command(nproc: int, worker_args: list[str]) -> list[str]:
    """The command line that starts `nproc` workers of this module on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "-m", "mpcourse.distributed", *worker_args]


def launch(runs: list[DistributedRun], config: RunConfig, nproc: int = 2,
           timeout_s: float | None = 300.0) -> list[DistributedResult]:
    """Train `config`'s model once per run on `nproc` local processes; return what each measured.

    All runs share one `torchrun` launch (starting processes costs more than these runs). The
    whole launch is stopped if it takes longer than `timeout_s` seconds (None: no limit) or
    is interrupted with Ctrl-C.
    """
    device_type = config.resolved_device().type
    check_nproc(nproc, device_type)
    if config.batch_size % nproc:
        raise ValueError(f"batch_size={config.batch_size} must split evenly over nproc={nproc} processes")
    runs = list(runs)
    with tempfile.TemporaryDirectory(prefix="mpcourse-dist-") as tmp:
        spec, out = Path(tmp, "spec.json"), Path(tmp, "results.json")
        spec.write_text(json.dumps({"config": dataclasses.asdict(config),
                                    "runs": [r.to_json() for r in runs]}))
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        process = subprocess.Popen(torchrun_command(nproc, ["--spec", str(spec), "--out", str(out)]),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=env, start_new_session=True)
        try:
            log, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(process)
            raise TimeoutError(f"the {nproc}-process run did not finish within {timeout_s} s")
        except KeyboardInterrupt:
            _stop(process)
            raise
        if process.returncode != 0 or not out.exists():
            raise RuntimeError(f"torchrun failed (exit code {process.returncode}):\n{log[-3000:]}")
        saved = json.loads(out.read_text())
    return [DistributedResult(run=run, **values) for run, values in zip(runs, saved)]


def run_for_precision(precision: str) -> DistributedRun:
    """The run `mpcourse train --nproc N --precision P` starts.

    FP32 (and TF32) train with DDP and an FP32 all-reduce. BF16 and FP16 train the way
    distributed mixed precision is usually done: FSDP2 with `param_dtype` set to that type and
    `reduce_dtype=torch.float32`.
    """
    if precision in ("fp32", "tf32"):
        return DistributedRun("ddp")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    if precision not in dtypes:
        raise ValueError(f"unknown precision {precision!r}; choose one of fp32, tf32, bf16, fp16")
    return DistributedRun("fsdp2", param_dtype=dtypes[precision], reduce_dtype=torch.float32)


def format_results(results: list[DistributedResult]) -> str:
    """The runs as a plain-text table: final loss, bytes communicated and memory per rank."""
    header = (f"{'run':36}{'ranks':>6}{'final loss':>11}{'gradient B/step':>16}"
              f"{'other B/step':>13}{'params B/rank':>14}{'grads B/rank':>13}")
    lines = [header, "-" * len(header)]
    for r in results:
        other = sum(r.bytes_per_step.values()) - r.gradient_bytes_per_step
        lines.append(f"{r.run.label:36}{r.world_size:>6}{r.losses[-1]:>11.4f}{r.gradient_bytes_per_step:>16,}"
                     f"{other:>13,}{max(r.param_bytes):>14,}{max(r.grad_bytes):>13,}")
    return "\n".join(lines)


def _stop(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop torchrun and every worker it started.

    torchrun starts each worker in a session of its own, so killing torchrun's process group
    would leave them running. SIGTERM lets torchrun stop its workers; whatever is left after
    `grace_s` (found beforehand, while they are still torchrun's descendants) is killed.
    """
    workers = _descendants(process.pid)
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _descendants(pid: int) -> list[int]:
    """The ids of all processes below `pid` (Linux /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def train_single_process(config: RunConfig) -> list[float]:
    """The reference: the same model, data and optimizer in one FP32 process; the loss per step."""
    model, batches = _model_and_data(config, config.resolved_device())
    optimizer = _adamw(model, config)
    losses = []
    for step in range(config.steps):
        x, y = batches.get(step)
        loss = next_token_loss(model(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _model_and_data(config: RunConfig, device: torch.device):
    torch.manual_seed(config.seed)
    text = MarkovText(config.vocab_size, seed=config.seed)
    batches = Batches(text, config.batch_size, config.seq_len, seed=config.seed, device=device)
    return GPT(config.model_config()).to(device), batches


def _adamw(model: torch.nn.Module, config: RunConfig):
    return torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)


def _train_one(run: DistributedRun, config: RunConfig, device: torch.device) -> dict:
    """One run on this rank (inside an initialized process group); rank 0's view of the results."""
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches = _model_and_data(config, device)
    model = _distribute(model, run, device)
    optimizer = _adamw(model, config)
    rows = slice(rank * config.batch_size // world, (rank + 1) * config.batch_size // world)
    losses, counted = [], None
    for step in range(config.steps):
        x, y = batches.get(step)
        counter = CollectiveCounter()
        with counter:
            loss = next_token_loss(model(x[rows]).float(), y[rows])
            loss.backward()
        if counted is None:
            counted = counter
            memory = [sum(_local(p).nbytes for p in model.parameters()),
                      sum(_local(p.grad).nbytes for p in model.parameters() if p.grad is not None)]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / world)
    everyone = [None] * world
    dist.all_gather_object(everyone, memory)
    return {"world_size": world, "backend": dist.get_backend(), "losses": losses,
            "bytes_per_step": counted.bytes, "param_bytes": [m[0] for m in everyone],
            "grad_bytes": [m[1] for m in everyone],
            "largest_gathered_bytes": counted.largest_gathered_bytes}


def _distribute(model: GPT, run: DistributedRun, device: torch.device) -> torch.nn.Module:
    if run.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        hook = compress_hook(run.compress)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        return ddp
    from torch.distributed.fsdp import fully_shard
    policy = sharding_policy(run.param_dtype, run.reduce_dtype)
    for block in model.blocks:   # one all-gather per block: only one block is ever unsharded
        fully_shard(block, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of a (possibly sharded, DTensor) tensor this rank stores."""
    return t.to_local() if hasattr(t, "to_local") else t


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def main(argv: list[str] | None = None) -> int:
    """A torchrun worker: train every run in --spec, rank 0 writes the results to --out."""
    import torch.distributed as dist
    parser = argparse.ArgumentParser(description="mpcourse distributed worker (started by torchrun)")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    config = RunConfig(**spec["config"])
    runs = [DistributedRun.from_json(r) for r in spec["runs"]]
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = config.resolved_device()
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        results = [_train_one(run, config, device) for run in runs]
        if dist.get_rank() == 0:
            Path(args.out).write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without running C++ static destructors: gloo's threads torn down at interpreter exit
    # sometimes abort the process ("terminate called without an active exception", SIGABRT)
    # after the work is done and the results written, which failed whole runs at random.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
