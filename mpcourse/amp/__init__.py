"""Automatic mixed precision, as `torch.amp` does it (lessons 03 to 05): `from mpcourse.amp import
autocast, GradScaler` as one would write `from torch.amp import autocast, GradScaler`.

- `autocast_mode`: `autocast`, which runs each op in the dtype its policy names, and traces it;
- `autocast_policy`: the op tables (`policy_for`, `explain_op`);
- `recipe_step`: one real training step of a recipe, each tensor's dtype recorded (lesson 03);
- `master`: `MasterWeightOptimizer`, FP32 master weights under 16-bit ones (lesson 04);
- `update_walk`: one weight under many small updates, kept by each cure (lessons 04 and 11);
- `fine_tune_forecast`: lesson 04's fine-tuning run predicted in closed form (`forecast_fine_tune`);
- `scale_update`: `update_scale`, the dynamic scale's rule, and what a valid scale is;
- `scaling`: `GradScaler` and `StaticLossScaler` (lesson 05);
- `optimizer_grads`: one optimizer's iteration as a scaler tracks it (stage, inf checks);
- `scaling_experiments`: lesson 05's experiments with them (lesson 09 repeats two).
"""
from mpcourse.amp.autocast_mode import autocast, call_path, profiled_casts
from mpcourse.amp.autocast_policy import (CATEGORIES, CATEGORY_FP32, CATEGORY_LOWER_PRECISION,
                                          CATEGORY_PROMOTE, AutocastPolicy, explain_op, policy_for,
                                          registered_ops)
from mpcourse.amp.recipe_step import StepDtypes, step_dtypes
from mpcourse.amp.master import MasterWeightOptimizer
from mpcourse.amp.update_walk import master_walk, stochastic_spread, walk
from mpcourse.amp.scaling import GradScaler, StaticLossScaler
from mpcourse.amp.scale_update import update_scale
from mpcourse.amp.scaling_experiments import clipped_step, resume_experiment, scale_trace, skipped_steps

__all__ = ["autocast", "call_path", "profiled_casts", "CATEGORIES", "CATEGORY_FP32",
    "CATEGORY_LOWER_PRECISION", "CATEGORY_PROMOTE", "AutocastPolicy", "explain_op", "policy_for",
    "registered_ops", "StepDtypes", "step_dtypes", "MasterWeightOptimizer", "master_walk",
    "stochastic_spread", "walk", "GradScaler", "StaticLossScaler", "update_scale", "clipped_step",
    "resume_experiment", "scale_trace", "skipped_steps"]
