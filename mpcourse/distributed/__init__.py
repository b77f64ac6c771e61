"""Mixed precision across processes: DDP gradient compression and FSDP2 precision policies
(lesson 08).

- `strategies`: `DistributedRun` (DDP with or without a 16-bit compress hook, or FSDP2 with a
  `MixedPrecisionPolicy`) and `DistributedRunConfig`, the variant that plugs a strategy into
  the one training loop of `mpcourse.train`;
- `collectives`: what each collective leaves on each rank (`collective_results`, gloo's own),
  and `CollectiveCounter`, the bytes a rank hands to each;
- `costs`: memory per rank, the bytes each rank sends per step, and a simulated 16-bit
  reduction, without launching;
- `launch`: `launch(runs, config, nproc)` starts `nproc` local processes through torchrun,
  and brings back each run's losses, bytes per collective and memory per rank;
- `worker`: what each of those processes runs.
- `drift`: how far each run's loss may drift from one process's, at the size that was measured.

The global batch is split evenly across ranks and every loss is averaged over all ranks, so a
distributed run computes what `mpcourse.train.train` computes in one process on the whole
batch, up to rounding.
"""
from mpcourse.distributed.collectives import COLLECTIVES, CollectiveCounter, collective_results
from mpcourse.distributed.costs import (RankMemory, memory_per_rank, simulated_reduce, wire_bytes,
                                       wire_bytes_of_payload)
from mpcourse.distributed.drift import DriftBounds, drift_bounds
from mpcourse.distributed.launch import DistributedResult, check_nproc, launch, torchrun_command
from mpcourse.distributed.strategies import (COMPRESSIONS, POLICY_DTYPES, STRATEGIES, DistributedRun,
                                             DistributedRunConfig, compress_hook, run_for_precision,
                                             sharding_policy)

__all__ = [
    "CollectiveCounter", "COLLECTIVES", "DriftBounds", "drift_bounds", "RankMemory", "collective_results",
    "memory_per_rank",
    "simulated_reduce", "wire_bytes", "wire_bytes_of_payload", "DistributedResult",
    "check_nproc", "launch", "torchrun_command", "COMPRESSIONS", "POLICY_DTYPES", "STRATEGIES",
    "DistributedRun", "DistributedRunConfig", "compress_hook", "run_for_precision",
    "sharding_policy",
]
