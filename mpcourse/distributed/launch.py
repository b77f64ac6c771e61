"""Starting local processes through torchrun, and what they bring back (lesson 08)."""
from __future__ import annotations

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

from mpcourse.distributed.costs import wire_bytes_of_payload
from mpcourse.distributed.strategies import DistributedRun, DistributedRunConfig
from mpcourse.train import RunConfig


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
    unit_output_dtypes: dict[str, str] = field(default_factory=dict)   # first block's modules, forward

    @property
    def gradient_bytes_per_step(self) -> int:
        """Bytes of gradients this rank sent per step (all-reduce for DDP, reduce-scatter for FSDP2)."""
        return self.bytes_per_step.get("all_reduce", 0) + self.bytes_per_step.get("reduce_scatter", 0)

    @property
    def wire_bytes_per_step(self) -> dict[str, int]:
        """The bytes this rank sent per step in each collective, in a ring, from the payloads
        `CollectiveCounter` measured."""
        return {kind: wire_bytes_of_payload(kind, payload, self.world_size)
                for kind, payload in self.bytes_per_step.items()}


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
    """The command line that starts `nproc` workers (`mpcourse.distributed.worker`) here."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "-m", "mpcourse.distributed.worker", *worker_args]


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
    for run in runs:  # refuse what a multi-process run cannot honour before starting anything
        DistributedRunConfig(**dataclasses.asdict(config), run=run)
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
