"""What sharding and 16-bit reductions cost, computed without launching any process (lesson 08).

- `memory_per_rank`: the bytes each rank holds under DDP or FSDP2;
- `wire_bytes`, `wire_bytes_of_payload`: the bytes each rank sends per step, in a ring;
- `simulated_reduce`: a 16-bit reduction's arithmetic, to see its error grow with the ranks.
"""
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
    _check_shape(strategy, num_parameters, world_size)
    if strategy == "ddp":
        return RankMemory(4 * num_parameters, 4 * num_parameters, 8 * num_parameters, 0, 0)
    sharding_policy(param_dtype, reduce_dtype)  # validates the dtypes
    shard = -(-num_parameters // world_size)    # ceil: FSDP2 pads the last shard
    return RankMemory(4 * shard, 4 * shard, 8 * shard, largest_unit * param_dtype.itemsize,
                      largest_unit * reduce_dtype.itemsize)


def wire_bytes(strategy: str, num_parameters: int, world_size: int,
               param_dtype: torch.dtype = torch.bfloat16, reduce_dtype: torch.dtype = torch.float32,
               reshard_after_forward: bool = True) -> dict[str, int]:
    """Bytes one rank sends per training step in each collective, with ring algorithms.

    DDP all-reduces the gradients in `reduce_dtype` (FP32, or 16 bits under a compress hook;
    `param_dtype` does not apply): a ring all-reduce sends 2·(W−1)/W of the buffer per rank,
    (W−1)/W as the sums go round and as much again as the results do. FSDP2 all-gathers a
    unit's parameters in `param_dtype` before its forward and, if the unit was resharded after
    the forward, again before its backward, each time sending (W−1)/W of the gathered bytes; it
    reduce-scatters the gradients in `reduce_dtype`, (W−1)/W of them. Buffers are split into
    ceil(N/W) elements per rank; FSDP2 pads each parameter's first dimension to a multiple of
    W instead, which adds a little when a first dimension does not divide by W.
    """
    _check_shape(strategy, num_parameters, world_size)
    for name, dtype in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    shard = -(-num_parameters // world_size)
    if strategy == "ddp":
        return {"all_reduce": 2 * (world_size - 1) * shard * reduce_dtype.itemsize}
    gather = (world_size - 1) * shard * param_dtype.itemsize
    return {"all_gather_forward": gather,
            "all_gather_backward": gather if reshard_after_forward else 0,
            "reduce_scatter": (world_size - 1) * shard * reduce_dtype.itemsize}


def wire_bytes_of_payload(collective: str, payload: int, world_size: int) -> int:
    """The bytes a rank sends for a collective in a ring, from the payload `CollectiveCounter`
    counts: the whole buffer for an all-reduce or a reduce-scatter (2·(W−1)/W and (W−1)/W of
    it go out), the rank's own shard for an all-gather (sent on W−1 times)."""
    factors = {"all_reduce": (2 * (world_size - 1), world_size),
               "reduce_scatter": (world_size - 1, world_size), "all_gather": (world_size - 1, 1)}
    if collective not in factors:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(factors)}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    numerator, denominator = factors[collective]
    return payload * numerator // denominator


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


def _check_shape(strategy: str, num_parameters: int, world_size: int) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    for name, value in (("num_parameters", num_parameters), ("world_size", world_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
