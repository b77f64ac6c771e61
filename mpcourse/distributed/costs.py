"""What sharding and 16-bit reductions cost, computed without launching anything (lesson 08)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mpcourse.distributed.strategies import STRATEGIES, sharding_policy


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
