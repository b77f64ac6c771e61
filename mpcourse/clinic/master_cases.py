"""Clinic cases of lesson 04, master weights and the optimizer's precision: 4, 10, 15 and 16.

16-bit parameters make 16-bit gradients, updates and optimizer state: GradScaler refuses the
gradients (case 4), small updates round away (cases 10 and 16), and Adam's state underflows or
overflows in fp16 (case 15). FP32 master weights fix each; stochastic rounding fixes case 10 too.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.clinic.case import Case, diagnosed, regression_data, scaled_step, tiny_mlp
from mpcourse.amp.master import MasterWeightOptimizer
from mpcourse.amp.scaling import GradScaler
from mpcourse.optim.stochastic import StochasticRoundingOptimizer


# ---------------------------------------------------------------------------------------------
# Case 4: fp16 parameters handed to GradScaler.

def _scaler_error(scaler, model: nn.Module, optimizer, x, y) -> str | None:
    """The error (type: message) one scaled step raises, or None if it runs."""
    loss = F.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    try:
        scaler.step(optimizer)
        scaler.update()
    except (ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return None


FP16_PARAMETERS = """
GradScaler with fp16 parameters: "Attempting to unscale FP16 gradients."
symptom: ValueError: Attempting to unscale FP16 gradients. (at scaler.step or unscale_)
cause: the model itself is fp16 (model.half()), so its gradients are fp16; dividing them by the
    scale in fp16 would flush small ones to zero, so the scaler refuses
fix: keep FP32 parameters and use autocast, or give the scaler an optimizer over FP32 master
    weights (MasterWeightOptimizer)
references: LLaVA #363; AdaFace #127
"""


def case_04_fp16_parameters(steps: int = 20) -> Case:
    """GradScaler refuses fp16 gradients; FP32 master weights give it FP32 ones."""
    x, y = regression_data(8, 4, 16, seed=4)
    errors = {}
    for name, scaler in (("torch", torch.amp.GradScaler("cpu")), ("mpcourse", GradScaler())):
        model = tiny_mlp(torch.float16)
        errors[name] = _scaler_error(scaler, model, torch.optim.SGD(model.parameters(), lr=0.1),
                                     x.half(), y)
    bf16_model = tiny_mlp(torch.bfloat16)
    bf16_error = _scaler_error(torch.amp.GradScaler("cpu"), bf16_model,
                               torch.optim.SGD(bf16_model.parameters(), lr=0.1), x.bfloat16(), y)
    model = tiny_mlp(torch.float16)
    optimizer = MasterWeightOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    losses, skipped = [], 0
    for _ in range(steps):
        loss = F.mse_loss(model(x.half()).float(), y)
        skipped += scaled_step(scaler, optimizer, loss)
        optimizer.zero_grad()
        losses.append(loss.item())
    before = {"torch_error": errors["torch"], "mpcourse_error": errors["mpcourse"],
              "bf16_parameters_error": bf16_error}
    after = {"error": None, "first_loss": losses[0], "last_loss": losses[-1], "steps": steps,
             "skipped_steps": skipped,
             "master_dtypes": sorted({str(p.dtype) for p in optimizer.master_parameters()}),
             "working_dtypes": sorted({str(p.dtype) for p in model.parameters()})}
    evidence = (f"torch and mpcourse raise '{errors['torch'].split(': ', 1)[1]}'; with FP32 "
                f"masters: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {steps} steps")
    return diagnosed(4, FP16_PARAMETERS, before, after, evidence)


# ---------------------------------------------------------------------------------------------
# Case 10: pure bf16 training without master weights.

def _bf16_regression(update: str, steps: int, lr: float, n: int = 32):
    """Fit y = X w_true with bf16 weights near 1; `update` is "bf16", "master" or "stochastic"."""
    g = torch.Generator().manual_seed(10)
    w_init = 1.0 + 0.1 * torch.rand(n, generator=g)
    w_true = w_init + 0.05 * (2 * torch.rand(n, generator=g) - 1)
    x = torch.randn(64, n, generator=g)
    y = x @ w_true
    weight = nn.Parameter(w_init.bfloat16())
    start = weight.detach().clone()
    if update == "bf16":
        optimizer = torch.optim.SGD([weight], lr=lr)
    elif update == "master":
        optimizer = MasterWeightOptimizer([weight], torch.optim.SGD, lr=lr)
    else:
        optimizer = StochasticRoundingOptimizer([weight], torch.optim.SGD, lr=lr,
                                                generator=torch.Generator().manual_seed(11))
    for _ in range(steps):
        loss = F.mse_loss((x.bfloat16() @ weight).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    never_moved = (weight.detach() == start).float().mean().item()
    final = F.mse_loss(x @ weight.detach().float(), y).item()
    initial = F.mse_loss(x @ start.float(), y).item()
    return {"never_moved": never_moved, "initial_loss": initial, "final_loss": final}


PURE_BF16_UPDATES = """
Pure bf16 training without master weights: small updates vanish
symptom: the loss stops falling early; most weights are bit-for-bit unchanged after hundreds of
    steps
cause: near 1.0 bf16 values are 2**-7 apart, so an update smaller than 2**-8 rounds straight
    back to the old weight
fix: keep FP32 master weights (MasterWeightOptimizer), or round the update stochastically
    (formats.round_to(..., rounding='stochastic'))
references: pytorch/ao PR #1124
"""


def case_10_pure_bf16_updates(steps: int = 200, lr: float = 1e-3) -> Case:
    """bf16 weights near 1 ignore updates below 2**-8; masters or stochastic rounding keep them."""
    pure = _bf16_regression("bf16", steps, lr)
    master = _bf16_regression("master", steps, lr)
    stochastic = _bf16_regression("stochastic", steps, lr)
    before = {"never_moved_fraction": pure["never_moved"], "initial_loss": pure["initial_loss"],
              "final_loss": pure["final_loss"], "bf16_half_spacing_near_1": 2.0**-8}
    after = {"master_never_moved_fraction": master["never_moved"],
             "master_final_loss": master["final_loss"],
             "stochastic_never_moved_fraction": stochastic["never_moved"],
             "stochastic_final_loss": stochastic["final_loss"]}
    evidence = (f"pure bf16: {pure['never_moved']:.0%} of weights never moved, loss "
                f"{pure['initial_loss']:.3f} -> {pure['final_loss']:.3f}; FP32 masters: "
                f"{master['final_loss']:.4f}; stochastic rounding: {stochastic['final_loss']:.4f}")
    return diagnosed(10, PURE_BF16_UPDATES, before, after, evidence)



# ---------------------------------------------------------------------------------------------
# Case 15: Adam on fp16 parameters.

GRADIENTS_15 = (0.0, 1e-3, 1.0, 1e4)


def _one_adam_step(wrap_in_masters: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One Adam step (lr 1e-3, eps 1e-8) on fp16 zeros with the gradients of case 15."""
    weight = nn.Parameter(torch.zeros(len(GRADIENTS_15), dtype=torch.float16))
    if wrap_in_masters:
        optimizer = MasterWeightOptimizer([weight], torch.optim.Adam, lr=1e-3)
    else:
        optimizer = torch.optim.Adam([weight], lr=1e-3)
    (weight * torch.tensor(GRADIENTS_15, dtype=torch.float16)).sum().backward()
    optimizer.step()
    state = next(iter(optimizer.state.values()))
    return weight.detach().clone(), state["exp_avg_sq"].clone()


FP16_ADAM = """
Adam on fp16 parameters: 0/0, x/0 and x/inf
symptom: NaN or inf weights after the first step, or weights that never move, with
    torch.optim.Adam on a model.half()
cause: Adam keeps its state in the parameters' dtype: in fp16 eps=1e-8 rounds to 0 (a zero
    gradient gives 0/0), (1-beta2)*g**2 underflows to 0 for g=1e-3 (x/0 = inf) and overflows to
    inf for g=1e4 (x/inf = 0)
fix: keep the optimizer in FP32: FP32 parameters under autocast, or FP32 masters
    (MasterWeightOptimizer)
references: optimi PR #15; optax PR #1769
"""


def case_15_fp16_adam() -> Case:
    """fp16 Adam state: eps=1e-8 is 0, 1e-3**2 * 1e-3 is 0, and 1e4**2 * 1e-3 is inf."""
    weight, exp_avg_sq = _one_adam_step(wrap_in_masters=False)
    fixed_weight, fixed_exp_avg_sq = _one_adam_step(wrap_in_masters=True)
    before = {"gradients": GRADIENTS_15, "eps_in_fp16": torch.tensor(1e-8).half().item(),
              "exp_avg_sq": exp_avg_sq.tolist(), "exp_avg_sq_dtype": str(exp_avg_sq.dtype),
              "weights_after_one_step": weight.tolist()}
    after = {"exp_avg_sq": fixed_exp_avg_sq.tolist(),
             "exp_avg_sq_dtype": str(fixed_exp_avg_sq.dtype),
             "weights_after_one_step": fixed_weight.tolist()}
    evidence = (f"gradients {list(GRADIENTS_15)}: fp16 weights {before['weights_after_one_step']}; "
                f"FP32 state: {after['weights_after_one_step']}")
    return diagnosed(15, FP16_ADAM, before, after, evidence)


# ---------------------------------------------------------------------------------------------
# Case 16: Adam on bf16 parameters: the weights stop, v does not underflow.

def _bf16_adam_run(steps: int, masters: bool, lr: float = 1e-4, n: int = 64) -> dict[str, Any]:
    g = torch.Generator().manual_seed(16)
    start = (1.0 + torch.rand(n, generator=g)).bfloat16()
    x = torch.randn(128, n, generator=g)
    y = x @ (start.float() + 0.05 * torch.randn(n, generator=g))
    weight = nn.Parameter(start.clone())
    optimizer = (MasterWeightOptimizer([weight], torch.optim.AdamW, lr=lr, weight_decay=0.0)
                 if masters else torch.optim.AdamW([weight], lr=lr, weight_decay=0.0))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(x.bfloat16() @ weight, y.bfloat16()).float()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    state = next(iter(optimizer.state.values()))
    return {"moved_fraction": (weight.detach() != start).float().mean().item(),
            "first_loss": losses[0], "last_loss": losses[-1],
            "exp_avg_sq_zeros": int((state["exp_avg_sq"] == 0).sum()),
            "exp_avg_sq_min": state["exp_avg_sq"].min().item(),
            "exp_avg_sq_dtype": str(state["exp_avg_sq"].dtype)}


def _decay(dtype: torch.dtype, steps: int, beta2: float = 0.999) -> float:
    """v after one gradient of 1 and then `steps` zero gradients, stored in `dtype`."""
    v = torch.tensor(1 - beta2, dtype=dtype)
    for _ in range(steps):
        v = v * beta2
    return v.item() / (1 - beta2)


BF16_ADAM = """
Adam on bf16 parameters: the weights stop updating
symptom: the loss is the same at every step and no weight changes, with AdamW on bf16 weights
cause: not underflow: bf16 has FP32's range, so v is far from 0. Adam's steps are about lr, and
    lr=1e-4 is below half bf16's gap near 1 (2**-8): each step rounds away. bf16 state also
    rounds beta2=0.999's decay away, so v never shrinks
fix: FP32 masters and FP32 optimizer state (MasterWeightOptimizer), or lesson 11's cures:
    stochastic rounding or Kahan compensation of the weights
references: keras-hub #2629; keras-hub PR #2772
"""


def case_16_bf16_adam(steps: int = 100) -> Case:
    """bf16 AdamW stalls; not because v underflows, but because its updates round away."""
    pure = _bf16_adam_run(steps, masters=False)
    master = _bf16_adam_run(steps, masters=True)
    before = {**pure, "v_left_after_100_zero_steps_bf16": _decay(torch.bfloat16, 100),
              "bf16_smallest_normal": torch.finfo(torch.bfloat16).tiny, "lr": 1e-4,
              "bf16_half_gap_in_1_2": 2.0**-8}
    after = {**master, "v_left_after_100_zero_steps_fp32": _decay(torch.float32, 100)}
    evidence = (f"bf16 AdamW, {steps} steps at lr 1e-4: {pure['moved_fraction']:.0%} of weights "
                f"moved, {pure['exp_avg_sq_zeros']} zeros in v (min {pure['exp_avg_sq_min']:.1e}); "
                f"FP32 masters: {master['moved_fraction']:.0%} moved, loss "
                f"{master['first_loss']:.2f} -> {master['last_loss']:.2f}")
    return diagnosed(16, BF16_ADAM, before, after, evidence)


