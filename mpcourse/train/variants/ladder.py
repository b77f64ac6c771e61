"""The bytes-per-parameter ladder: what each way of keeping weights and AdamW's moments costs.

Lesson 02 counts 16 bytes per parameter for AdamW in FP32: 4 for the weight, 4 for its gradient,
8 for the two moments. Each rung below keeps those roles differently (bytes per parameter kept
between steps; the layout of the library named):

===============================================  ======  ====  ======  =====  =======  =====
rung                                             weight  grad  master  comp.  moments  total
===============================================  ======  ====  ======  =====  =======  =====
FP32 weights and moments (torch.optim.AdamW)     4       4     -       -      4 + 4    16
BF16 + FP32 master (lesson 04; ZeRO's 2+2+12)    2       2     4       -      4 + 4    16
... + FP32 gradient accumulator (Megatron-LM)    2       4*    4       -      4 + 4    18
FP32 weights, BF16 moments                       4       4     -       -      2 + 2    12
BF16 weights + Kahan (optimi kahan_sum)          2       2     -       2      2 + 2    10
BF16 weights + stochastic rounding (torchao)     2       2     -       -      2 + 2    8
... + 8-bit moments, E4M3 / dynamic / E5M2 v     2       2     -       -      1 + 1    6 + scales
===============================================  ======  ====  ======  =====  =======  =====

(* the FP32 accumulator replaces the BF16 gradient, freed as soon as it is added in.) The 8-bit
rungs follow torchao's policy (`mpcourse.optim.optim_states`): tensors under 4,096 values keep BF16
moments, so their bytes depend on the model's tensor sizes, and each quantized block of 256
values adds two FP32 scales. `NO_CURE` (BF16 weights rounded to nearest, BF16 moments) costs
what the stochastic rung costs and shows what the cures are for: its small updates vanish.

A step needs more than it keeps: `step_peak` predicts the FP32 temporaries of `step()` too
(counted from the code; `mpcourse.memory.step_peak` measures them), and `bytes_per_rank` divides the kept bytes over W ranks
as ZeRO-1 and FSDP do, with lesson 08's shard sizes. Each rung is a `LadderRunConfig` for the one
training loop (`train.train`); `mpcourse.train.variants.ladder_measure` measures it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mpcourse.distributed.costs import memory_per_rank
from mpcourse.optim.kahan import KahanOptimizer
from mpcourse.optim.master_layouts import FP32MasterOptimizer
from mpcourse.train.models import GPT
from mpcourse.optim.optim_states import MIN_8BIT_SIZE, AdamW, is_8bit, quantizes
from mpcourse.optim.stochastic import StochasticRoundingOptimizer
from mpcourse.train.config import RunConfig

PLAIN_STATE_BYTES = {"fp32": 4, "bf16": 2}
BLOCK_SIZE = 256
#: The working set of one tensor's AdamW update (`optim_states.AdamW._update`), counted from the
#: code in FP32 tensors of that tensor's size, beyond the weight and gradient it is given: a
#: stored FP32 moment is updated in place, so only the denominator and the update are new (2); a
#: BF16 moment is decoded into an FP32 copy (the two moments and the denominator, 3); an 8-bit
#: moment, while the second one is encoded, adds the scaled block and a byte per code (E4M3 or
#: E5M2: 3.25) or, for the dynamic code, the search for the nearest entry (`codebooks`), whose
#: peak is the look-up of the entry above: the two moments, the scaled block, the int32 index,
#: the entry below, the index plus one, the entry looked up, and the int64 copy of that index
#: `aten::index` makes inside the op (two FP32 sizes; `step_memory` counts it): 9.
UPDATE_WORKING_SET = {"fp32": 2, "bf16": 3, "e4m3": 3.25, "e4m3+e5m2": 3.25, "dynamic": 9}
#: Stochastic rounding's working set while it writes one weight back (`formats.round_to`): the
#: random bits, the bits of the sum, and two more int32 tensors of the weight's size.
ROUNDING_WORKING_SET = 4


@dataclass(frozen=True)
class Rung:
    """One way to store weights and AdamW's moments.

    `weight_update`: "fp32" (FP32 weights, their own masters); "master" (BF16 weights and
    gradients, FP32 masters); "master_fp32_grads" (the same with FP32 gradient accumulators);
    or how an update reaches BF16 weights without a master: "nearest" (rounded to nearest: the
    update may vanish), "kahan" (with a BF16 compensation), "stochastic" (stochastic rounding).
    `state_format`: the moments' storage (`mpcourse.optim.optim_states.STATE_FORMATS`).
    """
    key: str
    label: str
    library: str
    weight_update: str
    state_format: str

    @property
    def weight_dtype(self) -> torch.dtype:
        return torch.float32 if self.weight_update == "fp32" else torch.bfloat16

    @property
    def copies_weights(self) -> bool:
        """Whether `step()` makes FP32 copies of the weights and gradients (no master to update)."""
        return self.weight_update in ("kahan", "stochastic")

    def bytes_per_role(self, sizes: list[int], block_size: int = BLOCK_SIZE) -> dict[str, float]:
        """Bytes kept between steps, per role, for tensors of `sizes` values."""
        n = sum(sizes)
        weight = 4 if self.weight_update == "fp32" else 2
        gradient = 4 if self.weight_update in ("fp32", "master_fp32_grads") else 2
        return {"weights": weight * n, "gradients": gradient * n,
                "masters": 4 * n if self.weight_update.startswith("master") else 0,
                "compensation": 2 * n if self.weight_update == "kahan" else 0,
                "moments": sum(self.moment_bytes(size, block_size) for size in sizes)}

    def moment_bytes(self, size: int, block_size: int = BLOCK_SIZE) -> float:
        """Bytes of both moments of one tensor of `size` values."""
        if not is_8bit(self.state_format):
            return 2 * PLAIN_STATE_BYTES[self.state_format] * size
        if quantizes(size, self.state_format, block_size):
            return 2 * (size + 4 * -(-size // block_size))
        return 2 * 2 * size  # torchao: the parameter's dtype, BF16 here

    def bytes_per_parameter(self, sizes: list[int], block_size: int = BLOCK_SIZE) -> float:
        return sum(self.bytes_per_role(sizes, block_size).values()) / sum(sizes)

    def step_peak(self, sizes: list[int], per_tensor: bool) -> float:
        """Predicted bytes alive at the peak of `step()`: what is kept, plus FP32 copies of the
        weights and gradients being stepped (every tensor's at once, or one tensor's at a time),
        plus the working set of the largest tensor's update or write-back, which is where the
        peak falls."""
        largest, n = max(sizes), sum(sizes)
        stepped = largest if per_tensor else n
        if self.copies_weights:
            copies = 8 * stepped                 # FP32 weight and gradient, made by the wrapper
        elif self.weight_update == "master":
            copies = 4 * stepped                 # the FP32 gradient; the master is updated in place
        elif self.weight_update == "nearest":
            copies = 8 * largest                 # AdamW's own FP32 copies, one tensor at a time
        else:
            copies = 0
        update = UPDATE_WORKING_SET[self.state_format if quantizes(largest, self.state_format)
                                    else "bf16" if self.state_format != "fp32" else "fp32"]
        if self.weight_update == "stochastic":
            update = max(update, ROUNDING_WORKING_SET)
        return sum(self.bytes_per_role(sizes).values()) + copies + 4 * update * largest

    def bytes_per_rank(self, sizes: list[int], world_size: int) -> dict[str, float]:
        """Bytes each of `world_size` ranks keeps: replicated (DDP), with the optimizer state
        (masters, compensation, moments) sharded (ZeRO-1), or everything sharded (FSDP). Shards
        are lesson 08's: ceil(N / W) values per rank."""
        n = sum(sizes)
        shard = memory_per_rank("fsdp2", n, world_size).parameters // 4  # FP32 bytes -> values
        roles = self.bytes_per_role(sizes)
        state = roles["masters"] + roles["compensation"] + roles["moments"]
        whole = sum(roles.values())
        return {"ddp": whole, "zero1": whole - state + state * shard / n,
                "fsdp": whole * shard / n}


LADDER = (
    Rung("fp32", "FP32 weights and moments", "torch.optim.AdamW", "fp32", "fp32"),
    Rung("master", "BF16 + FP32 master", "lesson 04; ZeRO's 2 + 2 + 12", "master", "fp32"),
    Rung("master_fp32_grads", "BF16 + FP32 master + FP32 grads", "Megatron-LM main_grad",
         "master_fp32_grads", "fp32"),
    Rung("bf16_moments", "FP32 weights, BF16 moments", "DeepSeek-V3's moments", "fp32", "bf16"),
    Rung("kahan", "BF16 + Kahan", "optimi kahan_sum", "kahan", "bf16"),
    Rung("stochastic", "BF16 + stochastic rounding", "torchao bf16_stochastic_round",
         "stochastic", "bf16"),
    Rung("e4m3", "BF16 + SR + E4M3 moments", "torchao AdamWFp8", "stochastic", "e4m3"),
    Rung("dynamic", "BF16 + SR + dynamic-code moments", "bitsandbytes / torchao AdamW8bit",
         "stochastic", "dynamic"),
    Rung("e5m2", "BF16 + SR + E4M3 m, E5M2 v",
         "Fishman et al. 2024, section 5 (no library's default)", "stochastic", "e4m3+e5m2"),
)
NO_CURE = Rung("nearest", "BF16 rounded to nearest (no cure)", "lesson 09, case 10", "nearest",
               "bf16")
RUNGS = {rung.key: rung for rung in (*LADDER, NO_CURE)}


@dataclass(frozen=True)
class LadderRunConfig(RunConfig):
    """A lesson-06 run at one rung of the ladder: `train(LadderRunConfig(rung="kahan"))`.

    BF16 rungs train a BF16 model with no autocast, so their forward and backward run in BF16;
    the optimizer computes in FP32 and stores as the rung says. No loss scaling: BF16 has FP32's
    range. `per_tensor`: whether the optimizer steps one tensor at a time (same results, a
    smaller peak; see `mpcourse.optim.stochastic.LowPrecisionWeightOptimizer`).
    """
    rung: str = "fp32"
    loss_scaling: str = "off"
    per_tensor: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.rung not in RUNGS:
            raise ValueError(f"unknown rung {self.rung!r}; choose one of {', '.join(RUNGS)}")
        if self.precision != "fp32":
            raise ValueError(f"a ladder run sets its precision through its weights' dtype; use "
                             f"precision='fp32' (no autocast), got {self.precision!r}")
        if self.loss_scaling != "off" or self.master_weights:
            raise ValueError("a ladder run takes no loss scaling and no master_weights switch "
                             "(its rung decides how weights are kept); got "
                             f"loss_scaling={self.loss_scaling!r}, master_weights={self.master_weights}")

    @property
    def label(self) -> str:
        return RUNGS[self.rung].label

    def prepare_model(self, model: GPT) -> torch.nn.Module:
        return model.to(RUNGS[self.rung].weight_dtype)

    def make_optimizer(self, model: torch.nn.Module):
        rung = RUNGS[self.rung]
        kwargs = dict(lr=self.lr, betas=(0.9, 0.95), weight_decay=0.0,
                      state_format=rung.state_format, block_size=BLOCK_SIZE,
                      min_8bit_size=MIN_8BIT_SIZE, unquantized_dtype=torch.bfloat16)
        params = list(model.parameters())
        if rung.weight_update in ("fp32", "nearest"):
            return AdamW(params, **kwargs), params
        if rung.weight_update.startswith("master"):
            fp32_grads = rung.weight_update == "master_fp32_grads"
            optimizer = FP32MasterOptimizer(params, AdamW, fp32_gradients=fp32_grads,
                                            per_tensor=self.per_tensor, **kwargs)
            return optimizer, optimizer.master_parameters() if fp32_grads else params
        if rung.weight_update == "kahan":
            return KahanOptimizer(params, AdamW, per_tensor=self.per_tensor, **kwargs), params
        generator = torch.Generator(device=params[0].device).manual_seed(self.seed)
        return StochasticRoundingOptimizer(params, AdamW, generator=generator,
                                           per_tensor=self.per_tensor, **kwargs), params
