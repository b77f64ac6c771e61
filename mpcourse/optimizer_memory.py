"""The bytes-per-parameter ladder: what each way of keeping weights and AdamW's moments costs.

Lesson 02 counts 16 bytes per parameter for AdamW in FP32: 4 for the weight, 4 for its gradient,
8 for the two moments. Each rung of the ladder below gives up some of those bytes:

=============================  ======  ========  ============  =======  ======
rung                           weight  gradient  compensation  moments  total
=============================  ======  ========  ============  =======  ======
FP32 AdamW (FP32 masters)      4       4         0             2 x 4    16
BF16 moments                   4       4         0             2 x 2    12
BF16 weights + Kahan           2       2         2             2 x 2    10
BF16 weights + stoch. rounding 2       2         0             2 x 2    8
8-bit moments                  2       2         0             2 x 1    6 (+ scales)
=============================  ======  ========  ============  =======  ======

8-bit moments add one FP32 scale per block of 256 values per moment, 2 x 4 / 256 bytes per
parameter. `NO_CURE` (BF16 weights rounded to nearest, BF16 moments) costs what the stochastic
rung costs and shows what the cures are for: its small updates vanish.

Each rung is a `LadderRunConfig` for the one training loop (`train.train`), and
`measure_training_state` counts the bytes its model and optimizer really hold, so that the
prediction (`Rung.bytes_per_parameter`) can be checked against the measurement.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mpcourse.data import Batches, MarkovText
from mpcourse.kahan import KahanOptimizer
from mpcourse.models import GPT, next_token_loss
from mpcourse.optim_states import AdamW
from mpcourse.stochastic import StochasticRoundingOptimizer
from mpcourse.train import RunConfig

WEIGHT_UPDATES = ("fp32", "nearest", "kahan", "stochastic")
STATE_BYTES = {"fp32": 4, "bf16": 2, "8bit": 1}
BLOCK_SIZE = 256


@dataclass(frozen=True)
class Rung:
    """One way to store weights and AdamW's moments.

    `weight_update`: "fp32" (FP32 weights, their own masters), or how an update reaches BF16
    weights: "nearest" (rounded to nearest: the update may vanish), "kahan" (with a BF16
    compensation buffer), "stochastic" (stochastic rounding). `state_format`: the moments' storage
    (see `mpcourse.optim_states`).
    """
    key: str
    label: str
    weight_update: str
    state_format: str

    @property
    def weight_dtype(self) -> torch.dtype:
        return torch.float32 if self.weight_update == "fp32" else torch.bfloat16

    def bytes_per_role(self, block_size: int = BLOCK_SIZE) -> dict[str, float]:
        """Bytes per parameter of each tensor a training step keeps."""
        weight = 4 if self.weight_update == "fp32" else 2
        scales = 4 / block_size if self.state_format == "8bit" else 0
        return {"weights": weight, "gradients": weight,
                "compensation": 2 if self.weight_update == "kahan" else 0,
                "moments": 2 * (STATE_BYTES[self.state_format] + scales)}

    def bytes_per_parameter(self, block_size: int = BLOCK_SIZE) -> float:
        return sum(self.bytes_per_role(block_size).values())


LADDER = (
    Rung("fp32", "FP32 AdamW (FP32 masters)", "fp32", "fp32"),
    Rung("bf16_moments", "BF16 moments", "fp32", "bf16"),
    Rung("kahan", "BF16 weights + Kahan", "kahan", "bf16"),
    Rung("stochastic", "BF16 weights + stochastic rounding", "stochastic", "bf16"),
    Rung("8bit", "BF16 weights + SR + 8-bit moments", "stochastic", "8bit"),
)
NO_CURE = Rung("nearest", "BF16 weights rounded to nearest (no cure)", "nearest", "bf16")
RUNGS = {rung.key: rung for rung in (*LADDER, NO_CURE)}


@dataclass(frozen=True)
class LadderRunConfig(RunConfig):
    """A lesson-06 run at one rung of the ladder: `train(LadderRunConfig(rung="kahan"))`.

    BF16 rungs train a BF16 model with no autocast, so their forward and backward run in BF16;
    the optimizer computes in FP32 and stores as the rung says. No loss scaling: BF16 has FP32's
    range.
    """
    rung: str = "fp32"
    loss_scaling: str = "off"

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
                      state_format=rung.state_format)
        params = list(model.parameters())
        if rung.weight_update in ("fp32", "nearest"):
            return AdamW(params, **kwargs), params
        if rung.weight_update == "kahan":
            return KahanOptimizer(params, AdamW, **kwargs), params
        generator = torch.Generator(device=params[0].device).manual_seed(self.seed)
        return StochasticRoundingOptimizer(params, AdamW, generator=generator, **kwargs), params


def measure_training_state(model: torch.nn.Module, optimizer) -> dict[str, int]:
    """Bytes held by the weights, their gradients and every tensor in the optimizer's state."""
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return {"weights": sum(p.nbytes for p in params),
            "gradients": sum(p.grad.nbytes for p in params if p.grad is not None),
            "optimizer state": sum(t.nbytes for t in state)}


def measure_rung(config: LadderRunConfig) -> dict[str, int]:
    """Build the run's model and optimizer as `train` does, take one step, and measure them
    with the gradients still in place (the moment a step holds the most state)."""
    torch.manual_seed(config.seed)
    model = config.prepare_model(GPT(config.model_config()))
    optimizer, _ = config.make_optimizer(model)
    x, y = Batches(MarkovText(config.vocab_size, seed=config.seed), config.batch_size,
                   config.seq_len, seed=config.seed).get(0)
    next_token_loss(model(x), y).backward()
    optimizer.step()
    return measure_training_state(model, optimizer)
