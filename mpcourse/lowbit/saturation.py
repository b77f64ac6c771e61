"""Which values a block-scaled cast saturates (lesson 10, exercise 10).

A block's scale X maps its values onto the element format. A value whose magnitude passes
element.max times X cannot be stored: the cast saturates it to +-element.max. The MX spec's floor
rule does this to every block whose amax lies in the top of its binade (for E4M3, amax / X in
(448, 512)); the round-up rule never does. `blockscale.snr_db` says how much a recipe's error
costs; `clipped_share` says how many values it clipped to get there.
"""
from __future__ import annotations

import torch

from mpcourse.lowbit.blockscale import BlockScaling, check_operand, quantize

#: A value counts as clipped when it passes element.max by more than this relative margin: with an
#: FP32 scale amax / element.max, the amax divided by its scale may round a hair above element.max
#: (power-of-two scales divide exactly, so for MX recipes the margin changes nothing).
MARGIN = 2.0**-20


def clipped_share(x: torch.Tensor, recipe: BlockScaling) -> float:
    """The share of `x`'s values, from 0 to 1, that `quantize(x, recipe)` saturates: those whose
    magnitude, divided by their block's full scale, passes recipe.element.max. NaN counts as not
    clipped."""
    check_operand(x, recipe)
    values = x.detach().float().reshape(-1, x.shape[-1])
    scales = quantize(values, recipe).block_scales()
    limit = recipe.element.max * (1 + MARGIN)
    return ((values / scales).abs() > limit).double().mean().item()
