"""A torchrun worker: trains every run of a launch with the one training loop (lesson 08).

`mpcourse.distributed.launch` starts `nproc` of these through torchrun. Each joins the process
group (gloo on a CPU, NCCL on GPUs), trains each run as a `DistributedRunConfig` with
`mpcourse.train.train`, and rank 0 writes what the runs measured to `--out`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from mpcourse.distributed.strategies import DistributedRun, DistributedRunConfig
from mpcourse.train import RunConfig, train


def train_on_every_rank(run: DistributedRun, config: RunConfig) -> dict:
    """One run on this rank (inside an initialized process group); what rank 0 reports."""
    import torch.distributed as dist
    result = train(DistributedRunConfig(**dataclasses.asdict(config), run=run))
    measured = result.measurements
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (measured["param_bytes"], measured["grad_bytes"]))
    return {"world_size": dist.get_world_size(), "backend": dist.get_backend(),
            "losses": result.losses, "bytes_per_step": measured["bytes_per_step"],
            "param_bytes": [m[0] for m in everyone], "grad_bytes": [m[1] for m in everyone],
            "largest_gathered_bytes": measured["largest_gathered_bytes"],
            "unit_output_dtypes": measured["unit_output_dtypes"]}


def main(argv: list[str] | None = None) -> int:
    """Train every run in --spec on this rank; rank 0 writes the results to --out."""
    import torch.distributed as dist
    parser = argparse.ArgumentParser(description="mpcourse distributed worker (started by torchrun)")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    config = RunConfig(**spec["config"])
    runs = [DistributedRun.from_json(r) for r in spec["runs"]]
    if config.resolved_device().type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if config.resolved_device().type == "cuda" else "gloo")
    try:
        results = [train_on_every_rank(run, config) for run in runs]
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
