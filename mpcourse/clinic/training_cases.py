"""Clinic cases of the training loop around the mechanisms: 12, 13 and 17.

How a loop calls torch's APIs: the deprecated `torch.cuda.amp`/`torch.cpu.amp` namespaces (case
12), a learning-rate scheduler that steps when GradScaler skipped (case 13), and activation
checkpointing that recomputes outside the forward's casting context (case 17). Lesson 06 runs
the loop they belong to.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointError, checkpoint

from mpcourse.amp.autocast_mode import autocast as mpcourse_autocast
from mpcourse.clinic.case import Case, diagnosed, regression_data, scaled_step, seeded


# ---------------------------------------------------------------------------------------------
# Case 12: the deprecated torch.cuda.amp / torch.cpu.amp APIs.

DEPRECATED_TO_MODERN = {
    "torch.cuda.amp.GradScaler()": "torch.amp.GradScaler('cuda')",
    "torch.cuda.amp.autocast()": "torch.amp.autocast('cuda')",
    "torch.cpu.amp.autocast()": "torch.amp.autocast('cpu')",
    "torch.cuda.amp.custom_fwd": "torch.amp.custom_fwd(device_type='cuda')",
}


def _deprecated_calls() -> None:
    torch.cuda.amp.GradScaler()
    with torch.cuda.amp.autocast():
        pass
    with torch.cpu.amp.autocast():
        pass
    torch.cuda.amp.custom_fwd(lambda ctx, x: x)


def _modern_calls(device_type: str) -> None:
    torch.amp.GradScaler(device_type)
    with torch.amp.autocast(device_type):
        pass
    with torch.amp.autocast("cpu"):
        pass
    torch.amp.custom_fwd(lambda ctx, x: x, device_type=device_type)


def _caught_warnings(calls: Callable[[], None]) -> tuple[list[str], list[str]]:
    """The messages of the FutureWarnings and of all other warnings that `calls` emits."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls()
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    return future, [str(w.message) for w in caught if not issubclass(w.category, FutureWarning)]


DEPRECATED_APIS = """
Deprecated torch.cuda.amp.* and torch.cpu.amp.* APIs
symptom: FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated (one per old call)
cause: the device-specific namespaces were folded into torch.amp, which takes the device as an
    argument
fix: torch.amp.autocast(device_type), torch.amp.GradScaler(device_type),
    torch.amp.custom_fwd/custom_bwd(device_type=...)
references: torch/amp/autocast_mode.py; torch/cuda/amp/grad_scaler.py
"""


def case_12_deprecated_apis() -> Case:
    """torch.cuda.amp.* and torch.cpu.amp.* warn (FutureWarning); torch.amp.* does not.

    Without CUDA the old CUDA calls also warn that CUDA is unavailable and disable themselves;
    those warnings are recorded separately (`other_messages`).
    """
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    old, old_other = _caught_warnings(_deprecated_calls)
    new, _ = _caught_warnings(lambda: _modern_calls(device_type))
    before = {"future_warnings": len(old), "messages": old, "other_messages": old_other}
    after = {"future_warnings": len(new), "device_type": device_type,
             "replacements": dict(DEPRECATED_TO_MODERN)}
    evidence = f"{len(old)} FutureWarnings from the old calls, {len(new)} from torch.amp"
    return diagnosed(12, DEPRECATED_APIS, before, after, evidence)


# ---------------------------------------------------------------------------------------------
# Case 13: GradScaler skips a step, the scheduler steps anyway.

def _warmup_run(steps: int, step_scheduler_only_when_stepped: bool) -> dict[str, Any]:
    """fp16 autocast with GradScaler and a linear learning-rate warm-up over 10 steps.

    The summed loss makes the first backward passes overflow at the default scale of 2**16, so
    the scaler skips them, as in real runs.
    """
    with seeded(13):
        model = nn.Linear(8, 8)
    x, y = regression_data(8, 8, 16, seed=13, target_scale=4.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    scaler = torch.amp.GradScaler("cpu")
    lr_of_taken_steps, skipped = [], 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(x), y, reduction="sum")
            lr = optimizer.param_groups[0]["lr"]
            was_skipped = scaled_step(scaler, optimizer, loss)
            skipped += was_skipped
            if not was_skipped:
                lr_of_taken_steps.append(lr)
            if not (step_scheduler_only_when_stepped and was_skipped):
                scheduler.step()
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return {"skipped_steps": skipped, "lr_of_first_taken_step": lr_of_taken_steps[0],
            "scheduler_steps": scheduler.last_epoch, "optimizer_steps": steps - skipped,
            "warnings": messages}


SCHEDULER_BEFORE_OPTIMIZER = """
GradScaler skips a step: "lr_scheduler.step() before optimizer.step()"
symptom: UserWarning: Detected call of `lr_scheduler.step()` before `optimizer.step()`, in a
    loop that calls them in the right order
cause: GradScaler skipped the first step(s) for an overflow, so optimizer.step() never ran; the
    scheduler still advanced, so warm-up runs ahead of the steps taken
fix: step the scheduler only when the optimizer stepped (the scale did not drop); or accept the
    warning where skipped steps are few and the schedule long
references: pytorch #44511; Lightning #21339
"""


def case_13_scheduler_before_optimizer(steps: int = 20) -> Case:
    """A skipped first step makes torch warn that the scheduler ran first, and shifts the schedule."""
    broken = _warmup_run(steps, step_scheduler_only_when_stepped=False)
    fixed = _warmup_run(steps, step_scheduler_only_when_stepped=True)
    before = {k: broken[k] for k in ("skipped_steps", "lr_of_first_taken_step", "scheduler_steps",
                                     "optimizer_steps", "warnings")}
    after = {k: fixed[k] for k in before}
    evidence = (f"{broken['skipped_steps']} of {steps} steps skipped; warning "
                f"{len(broken['warnings'])}x, first real step at lr "
                f"{broken['lr_of_first_taken_step']:.1e}; scheduler stepped only with the "
                f"optimizer: {len(fixed['warnings'])} warnings, first lr "
                f"{fixed['lr_of_first_taken_step']:.1e}")
    return diagnosed(13, SCHEDULER_BEFORE_OPTIMIZER, before, after, evidence)


# ---------------------------------------------------------------------------------------------
# Case 17: activation-checkpoint recompute outside the forward's casting context.

def _checkpointed_grads(mode: str) -> tuple[str | None, list[torch.Tensor] | None]:
    """Gradients of a small MLP run under mpcourse's autocast (a casting context that
    torch.utils.checkpoint does not know), with `mode` "none", "checkpoint" or "checkpoint+context"."""
    with seeded(17):
        mlp = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
    x = regression_data(16, 1, 4, seed=17)[0]
    region = lambda: mpcourse_autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    with region():
        if mode == "none":
            out = mlp(x)
        else:
            context = (lambda: (contextlib.nullcontext(), region())) if mode == "checkpoint+context" \
                else None
            kwargs = {"context_fn": context} if context else {}
            out = checkpoint(mlp, x, use_reentrant=False, **kwargs)
    try:
        out.float().sum().backward()
    except CheckpointError as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0]}", None
    return None, [p.grad.clone() for p in mlp.parameters()]


def _torch_autocast_checkpoint_matches() -> bool:
    """torch.utils.checkpoint records torch.autocast's state and replays it (pytorch PR #71169)."""
    grads = []
    for use_checkpoint in (False, True):
        with seeded(17):
            mlp = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
        x = regression_data(16, 1, 4, seed=17)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = checkpoint(mlp, x, use_reentrant=False) if use_checkpoint else mlp(x)
        out.float().sum().backward()
        grads.append([p.grad for p in mlp.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*grads))


CHECKPOINT_RECOMPUTE_CONTEXT = """
Activation checkpointing recomputes without the forward's casting context
symptom: CheckpointError: Recomputed values ... have different metadata (saved bfloat16,
    recomputed float32), or a dtype mismatch in backward
cause: the recompute runs in backward, after the forward's context has exited;
    torch.utils.checkpoint replays torch.autocast's state, but not a casting context it does not
    know (FSDP2's hooks, another library's autocast, this course's)
fix: give checkpoint the context to recompute under: checkpoint(fn, x, use_reentrant=False,
    context_fn=lambda: (nullcontext(), the_context()))
references: pytorch #141896; pytorch #148831; pytorch PR #71169
"""


def case_17_checkpoint_recompute_context() -> Case:
    """The recompute in backward runs outside the forward's casting context: a dtype mismatch."""
    error, _ = _checkpointed_grads("checkpoint")
    _, reference = _checkpointed_grads("none")
    fixed_error, fixed = _checkpointed_grads("checkpoint+context")
    matches = fixed is not None and all(torch.equal(a, b) for a, b in zip(reference, fixed))
    before = {"error": error, "torch_autocast_is_replayed": _torch_autocast_checkpoint_matches()}
    after = {"error": fixed_error, "grads_bitwise_equal_no_checkpoint": matches}
    evidence = (f"{'CheckpointError' if error else 'no error'} without context_fn; "
                f"with it: gradients {'bitwise equal to' if matches else 'differ from'} the run "
                f"without checkpointing; torch.autocast replayed: "
                f"{before['torch_autocast_is_replayed']}")
    return diagnosed(17, CHECKPOINT_RECOMPUTE_CONTEXT, before, after, evidence)
