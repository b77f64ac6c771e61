"""Clinic cases of lesson 05, loss scaling: 1, 5, 6 and 7.

A scale that collapses, clipping that ignores the scale, `unscale_` twice, and a resume that
forgot the scaler. Cases 5 and 7 run lesson 05's
own experiments (`mpcourse.amp.scaling_experiments`) on the clinic's small models.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.clinic.case import Case, diagnosed, regression_data, scaled_step, seeded, tiny_mlp
from mpcourse.amp.scaling import GradScaler
from mpcourse.amp.scaling_experiments import clipped_step, resume_experiment, skipped_steps


# ---------------------------------------------------------------------------------------------
# Case 1: gradients never zeroed, so one overflow stays in .grad and the scale halves forever.

def _fp16_scaled_run(steps: int, zero_grad: bool, scaler) -> dict[str, Any]:
    """Train a linear layer under fp16 autocast with `scaler`; record scales, skips and losses.

    The loss is a sum (not a mean), so its gradients are large enough that the default initial
    scale of 2**16 overflows FP16 in the first backward passes, as happens in real runs.
    """
    with seeded(1):
        model = nn.Linear(8, 8)
    x, y = regression_data(8, 8, 16, seed=1, target_scale=4.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    initial = [p.detach().clone() for p in model.parameters()]
    scales, losses, skipped = [], [], 0
    for _ in range(steps):
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y, reduction="sum")
        skipped += scaled_step(scaler, optimizer, loss)
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    moved = any(not torch.equal(p, q) for p, q in zip(model.parameters(), initial))
    return {"scales": scales, "losses": losses, "skipped_steps": skipped, "weights_moved": moved}


SCALE_COLLAPSE = """
Gradients never zeroed: the loss scale halves every step, to 0
symptom: GradScaler's scale falls by half every step and reaches 0; no step is taken (the same
    happens when the loss itself is inf or NaN)
cause: an ordinary early overflow put inf into .grad; without zero_grad the inf stays there and
    every later step looks like an overflow
fix: optimizer.zero_grad() every iteration (and check torch.isfinite(loss)); a scale below 1
    means no scale can help: look for the inf
references: fairseq #515; insightface #2262; PaddlePaddle #67895
"""


def case_01_scale_collapse(steps: int = 180) -> Case:
    """Without zero_grad, one overflow stays in .grad: every later step overflows, the scale -> 0."""
    broken = _fp16_scaled_run(steps, zero_grad=False, scaler=torch.amp.GradScaler("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = _fp16_scaled_run(steps, zero_grad=False, scaler=GradScaler())
    detected = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    fixed = _fp16_scaled_run(steps, zero_grad=True, scaler=torch.amp.GradScaler("cpu"))
    first_zero = next((i + 1 for i, s in enumerate(broken["scales"]) if s == 0.0), None)
    first_below_one = next((i + 1 for i, s in enumerate(broken["scales"]) if s < 1.0), None)
    before = {"init_scale": 2.0**16, "final_scale": broken["scales"][-1],
              "step_scale_below_1": first_below_one, "step_scale_reached_0": first_zero,
              "skipped_steps": broken["skipped_steps"], "steps": steps,
              "weights_moved": broken["weights_moved"],
              "mpcourse_scales_equal_torch": ours["scales"] == broken["scales"],
              "mpcourse_warning": detected[0] if detected else None, "scales": broken["scales"]}
    after = {"final_scale": fixed["scales"][-1], "skipped_steps": fixed["skipped_steps"],
             "steps": steps, "first_loss": fixed["losses"][0], "last_loss": fixed["losses"][-1],
             "weights_moved": fixed["weights_moved"], "scales": fixed["scales"]}
    evidence = (f"scale 2**16 -> 0 at step {first_zero}, {broken['skipped_steps']}/{steps} "
                f"steps skipped; with zero_grad: scale {fixed['scales'][-1]:g}, "
                f"{fixed['skipped_steps']} skipped, loss {fixed['losses'][0]:.0f} -> "
                f"{fixed['losses'][-1]:.0f}")
    return diagnosed(1, SCALE_COLLAPSE, before, after, evidence)


# ---------------------------------------------------------------------------------------------
# Case 5: clipping before unscale_.

def _clip_step(max_norm: float, scaler=None, unscale_first: bool = True):
    """One clipped SGD step (lr=1) of a small MLP; returns the model and the step's norms."""
    model = tiny_mlp(seed=5)
    x, y = regression_data(8, 4, 16, seed=5, target_scale=4.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    step = clipped_step(F.mse_loss(model(x), y), optimizer, model.parameters(), max_norm, scaler,
                        unscale_first)
    return model, step


CLIP_BEFORE_UNSCALE = """
Clipping before unscale_: the threshold is off by the scale
symptom: training crawls: every update is tiny, although the loss and scale look normal
cause: clip_grad_norm_ saw gradients multiplied by the scale (65536), so it clipped them to
    max_norm and the scaler then divided by 65536: the effective threshold is max_norm / scale
fix: scaler.unscale_(optimizer), then clip, then scaler.step(optimizer), scaler.update()
references: Pytorch-UNet #468; returnn #1590; pytorch/examples #1196
"""


def case_05_clip_before_unscale(max_norm: float = 1.0) -> Case:
    """Clipping scaled gradients clips at max_norm / scale: the update shrinks 65536-fold."""
    scale = 2.0**16
    reference, reference_step = _clip_step(max_norm)
    wrong, wrong_step = _clip_step(max_norm, torch.amp.GradScaler("cpu"), unscale_first=False)
    right, right_step = _clip_step(max_norm, torch.amp.GradScaler("cpu"), unscale_first=True)
    equal = lambda a, b: all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))  # noqa: E731
    wrong_norm, right_norm = wrong_step.applied_norm, right_step.applied_norm
    before = {"true_grad_norm": reference_step.true_norm, "max_norm": max_norm, "scale": scale,
              "applied_grad_norm": wrong_norm, "effective_max_norm": max_norm / scale,
              "matches_fp32_reference": equal(wrong, reference)}
    after = {"applied_grad_norm": right_norm, "reference_grad_norm": reference_step.applied_norm,
             "matches_fp32_reference": equal(right, reference)}
    evidence = (f"true norm {before['true_grad_norm']:.2f}, max_norm {max_norm}: applied norm "
                f"{wrong_norm:.2e} (= {max_norm}/65536) when clipped first, {right_norm:.4f} "
                f"after unscale_, bitwise equal to the FP32 reference")
    return diagnosed(5, CLIP_BEFORE_UNSCALE, before, after, evidence)


# ---------------------------------------------------------------------------------------------
# Case 6: unscale_ twice with gradient accumulation.

def _accumulated_step(scaler, micro_batches: int, unscale_each_micro_batch: bool,
                      max_norm: float = 1.0) -> tuple[nn.Module, str | None]:
    model = tiny_mlp(seed=6)
    x, y = regression_data(8, 4, 16, seed=6, target_scale=4.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            loss = F.mse_loss(model(xs), ys) / micro_batches
            if scaler is None:
                loss.backward()
                continue
            scaler.scale(loss).backward()
            if unscale_each_micro_batch:
                scaler.unscale_(optimizer)  # the mistake: once per micro-batch
                nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if scaler is not None and not unscale_each_micro_batch:
            scaler.unscale_(optimizer)  # once, after the last micro-batch
        if scaler is None or not unscale_each_micro_batch:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
    except RuntimeError as error:
        return model, f"{type(error).__name__}: {error}"
    return model, None


UNSCALE_TWICE = """
unscale_ called twice with gradient accumulation
symptom: RuntimeError: unscale_() has already been called on this optimizer since the last
    update().
cause: unscale_ (often hidden inside a clipping helper) ran for every micro-batch, but the
    gradients belong to one step: they may be unscaled once per update()
fix: accumulate all micro-batches, then unscale_ once, clip, step and update
references: transformers #23935; transformers #24449
"""


def case_06_unscale_twice(micro_batches: int = 4) -> Case:
    """unscale_ per micro-batch raises; unscale_ once per effective batch matches FP32."""
    _, torch_error = _accumulated_step(torch.amp.GradScaler("cpu"), micro_batches, True)
    _, our_error = _accumulated_step(GradScaler(), micro_batches, True)
    fixed, fixed_error = _accumulated_step(torch.amp.GradScaler("cpu"), micro_batches, False)
    reference, _ = _accumulated_step(None, micro_batches, False)
    difference = max((p - q).abs().max().item()
                     for p, q in zip(fixed.parameters(), reference.parameters()))
    before = {"torch_error": torch_error, "mpcourse_error": our_error,
              "micro_batches": micro_batches}
    after = {"error": fixed_error, "max_param_difference_vs_fp32": difference}
    evidence = (f"torch and mpcourse raise at the 2nd of {micro_batches} micro-batches; "
                f"unscale_ once: parameters within {difference:.1e} of the FP32 reference")
    return diagnosed(6, UNSCALE_TWICE, before, after, evidence)


# ---------------------------------------------------------------------------------------------
# Case 7: resuming without the scaler's state.

def _start_run():
    """A linear layer with Adam and torch's scaler, whose settled scale is below 2**16."""
    with seeded(7):
        model = nn.Linear(8, 8)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2), torch.amp.GradScaler("cpu")


def _train(model: nn.Module, optimizer, scaler, steps: range) -> list[float]:
    """fp16-autocast training on data drawn from each step's index; the scale after each step."""
    scales = []
    for step in steps:
        x, y = regression_data(8, 8, 16, seed=100 + step, target_scale=4.0)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y, reduction="sum")
        optimizer.zero_grad(set_to_none=True)
        scaled_step(scaler, optimizer, loss)
        scales.append(scaler.get_scale())
    return scales


RESUME_WITHOUT_SCALER_STATE = """
Resuming without the scaler's state
symptom: right after a resume, several steps are skipped (or the loss jumps) although the run
    was stable before the checkpoint
cause: the checkpoint held the model and optimizer but not the scaler, so the resumed run starts
    again at 2**16 and must overflow its way back down
fix: save scaler.state_dict() with the checkpoint and load it on resume
references: transformers PR #11663; fairseq2 #1346; accelerate #4289
"""


def case_07_resume_without_scaler_state(steps: int = 40, stop_at: int = 20) -> Case:
    """A resumed run that forgot the scaler restarts at 2**16 and skips steps to find it again."""
    runs = resume_experiment(_start_run, _train, steps, stop_at)
    saved = runs.checkpoint["scaler"]["scale"]
    forgot, kept = runs.without_scaler_state, runs.with_scaler_state
    forgot_skipped, kept_skipped = skipped_steps(forgot.scales), skipped_steps(kept.scales, saved)
    uninterrupted = runs.uninterrupted.model
    difference = lambda m: max((p - q).abs().max().item()  # noqa: E731
                               for p, q in zip(m.parameters(), uninterrupted.parameters()))
    after_stop = [s for s in skipped_steps(runs.uninterrupted.scales) if s >= stop_at]
    before = {"scale_at_checkpoint": saved, "scale_after_resume": 2.0**16,
              "skipped_after_resume": len(forgot_skipped), "scale_at_end": forgot.scales[-1],
              "uninterrupted_skipped_after_stop": len(after_stop),
              "max_param_difference_vs_uninterrupted": difference(forgot.model)}
    after = {"skipped_after_resume": len(kept_skipped),
             "max_param_difference_vs_uninterrupted": difference(kept.model),
             "bitwise_equal_to_uninterrupted": difference(kept.model) == 0.0}
    evidence = (f"scale at checkpoint {saved:g}; resumed at 2**16: "
                f"{len(forgot_skipped)} steps skipped; with the scaler state: "
                f"{len(kept_skipped)} skipped, bitwise equal to the uninterrupted run")
    return diagnosed(7, RESUME_WITHOUT_SCALER_STATE, before, after, evidence)
