"""Five more clinic cases (13 to 17), reproduced small with the installed torch and then fixed.

They follow `mpcourse.clinic`'s pattern: each `case_NN_*` makes the mistake, measures the symptom,
applies the fix, measures again, and returns a `Case`. `clinic.run_all` and `clinic.table`
include them, so the clinic lists 17 cases.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointError, checkpoint

from mpcourse.autocast import autocast as mpcourse_autocast
from mpcourse.clinic import Case, _regression_data, _scale_dropped, _seeded
from mpcourse.master import MasterWeightOptimizer


# ---------------------------------------------------------------------------------------------
# Case 13: GradScaler skips a step, the scheduler steps anyway.

def _warmup_run(steps: int, step_scheduler_only_when_stepped: bool) -> dict[str, Any]:
    """fp16 autocast with GradScaler and a linear learning-rate warm-up over 10 steps.

    The summed loss makes the first backward passes overflow at the default scale of 2**16, so
    the scaler skips them, as in real runs.
    """
    with _seeded(13):
        model = nn.Linear(8, 8)
    x, y = _regression_data(8, 8, 16, seed=13, target_scale=4.0)
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
            scaler.scale(loss).backward()
            before, lr = scaler.get_scale(), optimizer.param_groups[0]["lr"]
            scaler.step(optimizer)
            scaler.update()
            was_skipped = _scale_dropped(scaler, before)
            skipped += was_skipped
            if not was_skipped:
                lr_of_taken_steps.append(lr)
            if not (step_scheduler_only_when_stepped and was_skipped):
                scheduler.step()
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return {"skipped_steps": skipped, "lr_of_first_taken_step": lr_of_taken_steps[0],
            "scheduler_steps": scheduler.last_epoch, "optimizer_steps": steps - skipped,
            "warnings": messages}


def case_13_scheduler_before_optimizer(steps: int = 20) -> Case:
    """A skipped first step makes torch warn that the scheduler ran first, and shifts the schedule."""
    broken = _warmup_run(steps, step_scheduler_only_when_stepped=False)
    fixed = _warmup_run(steps, step_scheduler_only_when_stepped=True)
    before = {k: broken[k] for k in ("skipped_steps", "lr_of_first_taken_step", "scheduler_steps",
                                     "optimizer_steps", "warnings")}
    after = {k: fixed[k] for k in before}
    return Case(
        13, "GradScaler skips a step: \"lr_scheduler.step() before optimizer.step()\"",
        symptom="UserWarning: Detected call of `lr_scheduler.step()` before `optimizer.step()`, "
                "in a loop that calls them in the right order",
        cause="GradScaler skipped the first step(s) for an overflow, so optimizer.step() never "
              "ran; the scheduler still advanced, so warm-up runs ahead of the steps taken",
        fix="step the scheduler only when the optimizer stepped (the scale did not drop); or "
            "accept the warning where skipped steps are few and the schedule long",
        references=("pytorch #44511", "Lightning #21339"),
        before=before, after=after,
        evidence=(f"{broken['skipped_steps']} of {steps} steps skipped; warning "
                  f"{len(broken['warnings'])}x, first real step at lr "
                  f"{broken['lr_of_first_taken_step']:.1e}; scheduler stepped only with the "
                  f"optimizer: {len(fixed['warnings'])} warnings, first lr "
                  f"{fixed['lr_of_first_taken_step']:.1e}"))


# ---------------------------------------------------------------------------------------------
# Case 14: rotary position tables built in bf16.

class Rotary(nn.Module):
    """Rotary position embedding tables (cos, sin) for `seq_len` positions.

    `build_in_fp32=False` is the common mistake: positions are made in the dtype of the
    `inv_freq` buffer, which `model.to(torch.bfloat16)` has turned into bf16.
    """

    def __init__(self, dim: int, build_in_fp32: bool, base: float = 10000.0):
        super().__init__()
        self.dim, self.base, self.build_in_fp32 = dim, base, build_in_fp32
        self.register_buffer("inv_freq", inverse_frequencies(dim, base))

    def forward(self, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.build_in_fp32:  # from scratch: the buffer may have been cast to 16 bits
            inv_freq, build = inverse_frequencies(self.dim, self.base), torch.float32
        else:
            inv_freq, build = self.inv_freq, self.inv_freq.dtype
        angles = torch.outer(torch.arange(seq_len, dtype=build), inv_freq)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def inverse_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE's rotation speeds, base**(-2i/dim) for i < dim/2, in FP32."""
    return base ** -(torch.arange(0, dim, 2).float() / dim)


def _distinct_rows(table: torch.Tensor) -> int:
    return torch.unique(table, dim=0).shape[0]


def case_14_rope_in_bf16(seq_len: int = 1024, dim: int = 16) -> Case:
    """In bf16 positions 256 and 257 are one number, so their rotary angles are equal."""
    tables = {}
    for name, fp32 in (("bf16", False), ("fp32", True)):
        rotary = Rotary(dim, build_in_fp32=fp32).to(torch.bfloat16)
        tables[name] = rotary(seq_len, torch.bfloat16)
    exact = torch.outer(torch.arange(seq_len, dtype=torch.float64),
                        inverse_frequencies(dim).double())
    bf16_positions = torch.arange(seq_len, dtype=torch.bfloat16)
    before = {"position_257_in_bf16": bf16_positions[257].item(),
              "distinct_positions": _distinct_rows(bf16_positions[:, None]),
              "distinct_cos_rows": _distinct_rows(tables["bf16"][0]),
              "rows_256_257_equal": torch.equal(tables["bf16"][0][256], tables["bf16"][0][257]),
              "max_cos_error": (tables["bf16"][0].double() - exact.cos()).abs().max().item()}
    after = {"distinct_cos_rows": _distinct_rows(tables["fp32"][0]),
             "rows_256_257_equal": torch.equal(tables["fp32"][0][256], tables["fp32"][0][257]),
             "max_cos_error": (tables["fp32"][0].double() - exact.cos()).abs().max().item(),
             "seq_len": seq_len}
    return Case(
        14, "Rotary position tables built in bf16",
        symptom="quality falls with context length; positions far apart in the sequence get "
                "the same rotary angles",
        cause="bf16 keeps 8 significant bits: above 256 it cannot hold every integer, so "
              "position 257 is stored as 256, and model.to(bf16) also turns inv_freq into bf16",
        fix="build positions, angles, cos and sin in FP32 (autocast off), cast the finished "
            "tables to the model's dtype",
        references=("transformers PR #29285", "gpt-neox #1003"),
        before=before, after=after,
        evidence=(f"bf16: {before['distinct_positions']} distinct positions of {seq_len}, "
                  f"{before['distinct_cos_rows']} distinct cos rows, max cos error "
                  f"{before['max_cos_error']:.2f}; built in FP32: {after['distinct_cos_rows']} "
                  f"rows, error {after['max_cos_error']:.4f}"))


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
    return Case(
        15, "Adam on fp16 parameters: 0/0, x/0 and x/inf",
        symptom="NaN or inf weights after the first step, or weights that never move, with "
                "torch.optim.Adam on a model.half()",
        cause="Adam keeps its state in the parameters' dtype: in fp16 eps=1e-8 rounds to 0 "
              "(a zero gradient gives 0/0), (1-beta2)*g**2 underflows to 0 for g=1e-3 (x/0 = "
              "inf) and overflows to inf for g=1e4 (x/inf = 0)",
        fix="keep the optimizer in FP32: FP32 parameters under autocast, or FP32 masters "
            "(MasterWeightOptimizer)",
        references=("optimi PR #15", "optax PR #1769"),
        before=before, after=after,
        evidence=(f"gradients {list(GRADIENTS_15)}: fp16 weights {before['weights_after_one_step']}; "
                  f"FP32 state: {after['weights_after_one_step']}"))


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


def case_16_bf16_adam(steps: int = 100) -> Case:
    """bf16 AdamW stalls; not because v underflows, but because its updates round away."""
    pure = _bf16_adam_run(steps, masters=False)
    master = _bf16_adam_run(steps, masters=True)
    before = {**pure, "v_left_after_100_zero_steps_bf16": _decay(torch.bfloat16, 100),
              "bf16_smallest_normal": torch.finfo(torch.bfloat16).tiny, "lr": 1e-4,
              "bf16_half_gap_in_1_2": 2.0**-8}
    after = {**master, "v_left_after_100_zero_steps_fp32": _decay(torch.float32, 100)}
    return Case(
        16, "Adam on bf16 parameters: the weights stop updating",
        symptom="the loss is the same at every step and no weight changes, with AdamW on bf16 "
                "weights",
        cause="not underflow: bf16 has FP32's range, so v is far from 0. Adam's steps are about "
              "lr, and lr=1e-4 is below half bf16's gap near 1 (2**-8): each step rounds away. "
              "bf16 state also rounds beta2=0.999's decay away, so v never shrinks",
        fix="FP32 masters and FP32 optimizer state (MasterWeightOptimizer), or lesson 11's "
            "cures: stochastic rounding or Kahan compensation of the weights",
        references=("keras-hub #2629", "keras-hub PR #2772"),
        before=before, after=after,
        evidence=(f"bf16 AdamW, {steps} steps at lr 1e-4: {pure['moved_fraction']:.0%} of weights "
                  f"moved, {pure['exp_avg_sq_zeros']} zeros in v (min {pure['exp_avg_sq_min']:.1e}); "
                  f"FP32 masters: {master['moved_fraction']:.0%} moved, loss "
                  f"{master['first_loss']:.2f} -> {master['last_loss']:.2f}"))


# ---------------------------------------------------------------------------------------------
# Case 17: activation-checkpoint recompute outside the forward's casting context.

def _checkpointed_grads(mode: str) -> tuple[str | None, list[torch.Tensor] | None]:
    """Gradients of a small MLP run under mpcourse's autocast (a casting context that
    torch.utils.checkpoint does not know), with `mode` "none", "checkpoint" or "checkpoint+context"."""
    with _seeded(17):
        mlp = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
    x = _regression_data(16, 1, 4, seed=17)[0]
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
        with _seeded(17):
            mlp = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
        x = _regression_data(16, 1, 4, seed=17)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = checkpoint(mlp, x, use_reentrant=False) if use_checkpoint else mlp(x)
        out.float().sum().backward()
        grads.append([p.grad for p in mlp.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*grads))


def case_17_checkpoint_recompute_context() -> Case:
    """The recompute in backward runs outside the forward's casting context: a dtype mismatch."""
    error, _ = _checkpointed_grads("checkpoint")
    _, reference = _checkpointed_grads("none")
    fixed_error, fixed = _checkpointed_grads("checkpoint+context")
    matches = fixed is not None and all(torch.equal(a, b) for a, b in zip(reference, fixed))
    before = {"error": error, "torch_autocast_is_replayed": _torch_autocast_checkpoint_matches()}
    after = {"error": fixed_error, "grads_bitwise_equal_no_checkpoint": matches}
    return Case(
        17, "Activation checkpointing recomputes without the forward's casting context",
        symptom="CheckpointError: Recomputed values ... have different metadata (saved bfloat16, "
                "recomputed float32), or a dtype mismatch in backward",
        cause="the recompute runs in backward, after the forward's context has exited; "
              "torch.utils.checkpoint replays torch.autocast's state, but not a casting context "
              "it does not know (FSDP2's hooks, another library's autocast, this course's)",
        fix="give checkpoint the context to recompute under: checkpoint(fn, x, "
            "use_reentrant=False, context_fn=lambda: (nullcontext(), the_context()))",
        references=("pytorch #141896", "pytorch #148831", "pytorch PR #71169"),
        before=before, after=after,
        evidence=(f"{'CheckpointError' if error else 'no error'} without context_fn; "
                  f"with it: gradients {'bitwise equal to' if matches else 'differ from'} the run "
                  f"without checkpointing; torch.autocast replayed: "
                  f"{before['torch_autocast_is_replayed']}"))


CASES = (case_13_scheduler_before_optimizer, case_14_rope_in_bf16, case_15_fp16_adam,
         case_16_bf16_adam, case_17_checkpoint_recompute_context)
