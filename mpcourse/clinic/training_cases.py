"""Clinic cases of the training loop around the mechanisms: 12, 13, 17 and 18.

How a loop calls torch's APIs: the deprecated `torch.cuda.amp`/`torch.cpu.amp` namespaces (case
12), a learning-rate scheduler that steps when GradScaler skipped (case 13), activation
checkpointing that recomputes outside the forward's casting context (case 17), and two runs of
one loop that differ because their sums add in different orders (case 18). Lesson 06 runs the
loop they belong to.
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


# ---------------------------------------------------------------------------------------------
# Case 18: two identical runs differ (GPU non-determinism).

def order_spread(dtype: torch.dtype, orders: int = 8, n: int = 4096) -> dict[str, Any]:
    """One sum of `n` seeded values accumulated in `dtype` in `orders` random orders, as a GPU's
    atomic adds (index_add_, scatter_add_, embedding and attention backward) may apply them:
    how many different results, and their spread relative to the float64 sum."""
    g = torch.Generator().manual_seed(18)
    values = torch.randn(n, generator=g)
    slot = torch.zeros(n, dtype=torch.long)
    results = set()
    for _ in range(orders):
        order = torch.randperm(n, generator=g)
        results.add(torch.zeros(1, dtype=dtype).index_add_(0, slot, values[order].to(dtype)).item())
    exact = values.double().sum().item()
    return {"distinct_results": len(results), "relative_spread": (max(results) - min(results)) / abs(exact)}


def _embedding_run(order_seed: int | None, steps: int = 30) -> tuple[list[float], nn.Module]:
    """A small embedding model trained by SGD in FP32 on fixed tokens. With `order_seed`, each
    step presents the batch's positions in a random order: the same loss (a mean), but every
    gradient sum (the embedding rows', the head's over positions) adds its terms in another
    order, as atomics do on a GPU. With None, the order is the same every step and every run."""
    with seeded(18):
        model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    g = torch.Generator().manual_seed(180)
    tokens = torch.randint(16, (256,), generator=g)
    targets = (tokens * 5 + 3) % 16
    shuffle = torch.Generator().manual_seed(order_seed) if order_seed is not None else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        order = torch.randperm(len(tokens), generator=shuffle) if shuffle else torch.arange(len(tokens))
        loss = F.cross_entropy(model(tokens[order]), targets[order])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


def _compare_runs(first: int | None, second: int | None) -> dict[str, Any]:
    (losses_a, model_a), (losses_b, model_b) = _embedding_run(first), _embedding_run(second)
    differing = [step for step, (a, b) in enumerate(zip(losses_a, losses_b)) if a != b]
    return {"first_differing_step": differing[0] if differing else None,
            "differing_steps": len(differing),
            "max_loss_difference": max(abs(a - b) for a, b in zip(losses_a, losses_b)),
            "weights_bitwise_equal": all(torch.equal(a, b) for a, b in
                                         zip(model_a.parameters(), model_b.parameters()))}


RUN_TO_RUN_DIFFERENCES = """
Two identical runs differ (GPU non-determinism)
symptom: the same seed, data and code give losses that agree for a few steps and then drift
    apart on a GPU; a checkpoint resume that should be bit for bit is not
cause: a floating-point sum depends on its order, and CUDA kernels that add with atomics
    (index_add_, scatter_add_, embedding backward, the attention backward of SDPA's
    memory-efficient and FlashAttention kernels) or split a GEMM's sum (cuBLAS's workspace
    across streams) add in whatever order the threads arrive; 16-bit accumulation makes each
    difference larger, and training amplifies it step by step
fix: torch.use_deterministic_algorithms(True) (fixed-order kernels, or an error naming an op
    that has none) with CUBLAS_WORKSPACE_CONFIG=:4096:8 set before the first cuBLAS call, plus
    seeds; it costs speed (sorted or single-split reductions), so keep it for debugging and
    for tests that compare bit for bit
references: PyTorch notes, Reproducibility; torch.use_deterministic_algorithms; cuBLAS docs,
    Results reproducibility; pytorch aten/src/ATen/native/transformers/cuda/attention_backward.cu
"""


def case_18_run_to_run_differences() -> Case:
    """The same sum in another order gives other bits; two runs that add in different orders
    drift apart, and two that add in one fixed order agree bit for bit."""
    before = {"fp32_sum": order_spread(torch.float32), "bf16_sum": order_spread(torch.bfloat16),
              **_compare_runs(1, 2)}
    after = _compare_runs(None, None)
    evidence = (f"one sum of 4096 values in 8 orders: {before['fp32_sum']['distinct_results']} "
                f"different results in fp32, {before['bf16_sum']['distinct_results']} in bf16; two "
                f"runs adding in different orders end with weights bitwise equal: "
                f"{before['weights_bitwise_equal']}; in one fixed order: "
                f"{after['weights_bitwise_equal']}")
    return diagnosed(18, RUN_TO_RUN_DIFFERENCES, before, after, evidence)
