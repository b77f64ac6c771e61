"""The runs that plug a lower part of the course into the one training loop through `RunConfig`:
`train(Fp8RunConfig(...))` as `train(RunConfig(...))`.

- `fp8`: `Fp8RunConfig`, the blocks' linears in FP8 (lesson 07);
- `block_scaled`: `BlockScaledRunConfig` and `OutlierRunConfig`, and `linear_operands` (lesson 10);
- `ladder`: the optimizer ladder's rungs, each a `LadderRunConfig` (lesson 11);
- `ladder_measure`: each rung's memory and loss, measured.
"""
from mpcourse.train.variants.block_scaled import BlockScaledRunConfig, OutlierRunConfig, linear_operands
from mpcourse.train.variants.fp8 import Fp8RunConfig
from mpcourse.train.variants.ladder import LADDER, NO_CURE, RUNGS, LadderRunConfig, Rung
from mpcourse.train.variants.ladder_measure import T_975, RungMemory, SeedInterval, measure_rung, seed_interval

__all__ = ["BlockScaledRunConfig", "OutlierRunConfig", "linear_operands", "Fp8RunConfig", "LADDER", "NO_CURE",
           "RUNGS", "LadderRunConfig", "Rung", "T_975", "RungMemory", "SeedInterval", "measure_rung", "seed_interval"]
