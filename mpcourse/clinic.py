"""The mixed-precision clinic: the failures people report most, reproduced small and then fixed (lesson 09).

Each `case_NN_*` function builds a tiny model, makes the mistake, measures the symptom (a NaN
loss, a scale that falls to 0, an exception, a stall, a slowdown), applies the fix and measures
again. It returns a `Case`: the diagnosis in words and the numbers measured before and after the
fix. The lesson prints those numbers, the tests assert them, and `table` renders the closing
"symptom -> cause -> fix" table from the same records, so prose, tests and table cannot disagree.

Every reproduction uses a few small tensors, because on a CPU without 16-bit instructions fp16
and bf16 math is emulated and slow; on one CPU thread each case takes well under a second (case
8, which times things, a little longer). On tensors this small, extra threads only add waiting.
"""
from __future__ import annotations

import contextlib
import copy
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from mpcourse import hardware
from mpcourse.autocast import autocast as mpcourse_autocast
from mpcourse.autocast import policy_for
from mpcourse.benchmark import compare
from mpcourse.formats import BF16, round_to
from mpcourse.master import MasterWeightOptimizer
from mpcourse.scaling import GradScaler

FP16_MAX = torch.finfo(torch.float16).max  # 65504


@dataclass(frozen=True)
class Case:
    """One clinic case: what the learner sees, why, the fix, and the numbers measured for both."""
    number: int
    title: str
    symptom: str
    cause: str
    fix: str
    references: tuple[str, ...]
    before: dict[str, Any]  # measured with the mistake in place
    after: dict[str, Any]   # measured with the fix applied
    evidence: str           # one line built from `before` and `after`

    def __str__(self) -> str:
        lines = [f"Case {self.number}: {self.title}", f"  symptom : {self.symptom}",
                 f"  cause   : {self.cause}", f"  fix     : {self.fix}",
                 f"  measured: {self.evidence}"]
        return "\n".join(lines)


@contextlib.contextmanager
def _seeded(seed: int):
    """Seed torch's global generator for the block, then restore whatever state it had."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _regression_data(n_in: int, n_out: int, batch: int, seed: int, target_scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n_in, generator=g)
    y = target_scale * torch.randn(batch, n_out, generator=g)
    return x, y


def _scale_dropped(scaler, before: float) -> bool:
    """A dynamic scaler lowers its scale exactly when it skipped the step for an inf or NaN."""
    return scaler.get_scale() < before


# ---------------------------------------------------------------------------------------------
# Case 1: gradients never zeroed, so one overflow stays in .grad and the scale halves forever.

def _fp16_scaled_run(steps: int, zero_grad: bool, scaler) -> dict[str, Any]:
    """Train a linear layer under fp16 autocast with `scaler`; record scales, skips and losses.

    The loss is a sum (not a mean), so its gradients are large enough that the default initial
    scale of 2**16 overflows FP16 in the first backward passes, as happens in real runs.
    """
    with _seeded(1):
        model = nn.Linear(8, 8)
    x, y = _regression_data(8, 8, 16, seed=1, target_scale=4.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    initial = [p.detach().clone() for p in model.parameters()]
    scales, losses, skipped = [], [], 0
    for _ in range(steps):
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y, reduction="sum")
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped += _scale_dropped(scaler, before)
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    moved = any(not torch.equal(p, q) for p, q in zip(model.parameters(), initial))
    return {"scales": scales, "losses": losses, "skipped_steps": skipped, "weights_moved": moved}


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
    return Case(
        1, "Gradients never zeroed: the loss scale halves every step, to 0",
        symptom="GradScaler's scale falls by half every step and reaches 0; no step is taken "
                "(the same happens when the loss itself is inf or NaN)",
        cause="an ordinary early overflow put inf into .grad; without zero_grad the inf stays "
              "there and every later step looks like an overflow",
        fix="optimizer.zero_grad() every iteration (and check torch.isfinite(loss)); a scale "
            "below 1 means no scale can help: look for the inf",
        references=("fairseq #515", "insightface #2262", "PaddlePaddle #67895"),
        before=before, after=after,
        evidence=(f"scale 2**16 -> 0 at step {first_zero}, {broken['skipped_steps']}/{steps} "
                  f"steps skipped; with zero_grad: scale {fixed['scales'][-1]:g}, "
                  f"{fixed['skipped_steps']} skipped, loss {fixed['losses'][0]:.0f} -> "
                  f"{fixed['losses'][-1]:.0f}"))


# ---------------------------------------------------------------------------------------------
# Case 2: activations beyond FP16's largest value.

class _WideActivations(nn.Module):
    """Linear -> LayerNorm -> Linear, with a first layer whose outputs reach about 1e5.

    Models pretrained in bf16 (T5 is the famous one) grow activations like these, which bf16's
    range holds easily and fp16's does not. `fp32_first_layer` runs that layer outside autocast.
    """

    def __init__(self, fp32_first_layer: bool = False):
        super().__init__()
        self.wide = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 4)
        self.fp32_first_layer = fp32_first_layer
        with torch.no_grad():
            self.wide.weight.mul_(1e5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fp32_first_layer:
            with torch.autocast(x.device.type, enabled=False):
                hidden = self.wide(x.float())
        else:
            hidden = self.wide(x)
        return self.out(self.norm(hidden)), hidden


def case_02_fp16_overflow() -> Case:
    """Activations above 65504 become inf in fp16, then NaN; bf16 or an fp32 layer keeps them."""
    with _seeded(2):
        model = _WideActivations()
    x, y = _regression_data(16, 4, 8, seed=2)
    results = {}
    for name, dtype, fp32_layer in (("fp32", None, False), ("fp16", torch.float16, False),
                                    ("bf16", torch.bfloat16, False),
                                    ("fp16 + fp32 layer", torch.float16, True)):
        model.fp32_first_layer = fp32_layer
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out, hidden = model(x)
            loss = F.mse_loss(out.float(), y)
        results[name] = {"max_abs_hidden": hidden.float().abs().nan_to_num(posinf=math.inf).max().item(),
                         "inf_count": int(torch.isinf(hidden).sum()), "loss": loss.item()}
    reference = results["fp32"]["loss"]
    before = {"fp32_max_activation": results["fp32"]["max_abs_hidden"],
              "fp16_max": FP16_MAX, "fp16_inf_activations": results["fp16"]["inf_count"],
              "fp16_loss": results["fp16"]["loss"], "fp32_loss": reference}
    after = {"bf16_loss": results["bf16"]["loss"], "bf16_inf_activations": results["bf16"]["inf_count"],
             "fp16_fp32_layer_loss": results["fp16 + fp32 layer"]["loss"],
             "bf16_rel_error": abs(results["bf16"]["loss"] - reference) / reference,
             "fp16_fp32_layer_rel_error":
                 abs(results["fp16 + fp32 layer"]["loss"] - reference) / reference}
    return Case(
        2, "Activations beyond 65504: fp16 gives inf, then NaN",
        symptom="the loss is NaN from the first step in fp16, while fp32 and bf16 train",
        cause=f"an activation larger than fp16's maximum ({FP16_MAX:g}) rounds to inf; the next "
              "normalization computes inf - inf = NaN",
        fix="train in bf16 (same range as fp32), or run the offending layer in fp32 "
            "(autocast(enabled=False) around it)",
        references=("transformers #5651", "transformers #10956"),
        before=before, after=after,
        evidence=(f"largest activation {before['fp32_max_activation']:.0f} > {FP16_MAX:g}: "
                  f"{before['fp16_inf_activations']} infs, fp16 loss {before['fp16_loss']}; bf16 "
                  f"loss off by {after['bf16_rel_error']:.2%}, fp32 layer off by "
                  f"{after['fp16_fp32_layer_rel_error']:.3%}"))


# ---------------------------------------------------------------------------------------------
# Case 3: a finfo(fp16).min mask plus a negative bias overflows to -inf; softmax gives NaN.

def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     bias: torch.Tensor, softmax_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Attention whose scores get an additive `mask` and `bias`, as encoder-decoder models do.

    `softmax_dtype=None` adds and normalizes in the inputs' dtype; `torch.float32` upcasts the
    scores first, adds the mask and bias and takes the softmax in fp32, then returns to the
    inputs' dtype for the product with `v`.
    """
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softmax_dtype is not None:
        scores, mask, bias = scores.to(softmax_dtype), mask.to(softmax_dtype), bias.to(softmax_dtype)
    weights = torch.softmax(scores + mask + bias, dim=-1)
    return weights.to(v.dtype) @ v


def _left_padded_causal_mask(length: int, padding: int, dtype: torch.dtype) -> torch.Tensor:
    """finfo(dtype).min where a query may not look: the future, and the padding on the left."""
    blocked = torch.ones(length, length, dtype=torch.bool).triu(1)
    blocked[:, :padding] = True
    return torch.zeros(length, length, dtype=dtype).masked_fill(blocked, torch.finfo(dtype).min)


def case_03_attention_mask_overflow(length: int = 6, padding: int = 2, dim: int = 8) -> Case:
    """finfo(fp16).min + a negative bias = -inf; a fully masked row then softmaxes to NaN."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(length, dim, generator=g) for _ in range(3))
    bias = -20.0 * torch.ones(length, length)  # e.g. a relative-position bias for far positions
    mask16 = _left_padded_causal_mask(length, padding, torch.float16)
    args16 = [t.half() for t in (q, k, v)]

    def two_layers(softmax_dtype):
        hidden = masked_attention(*args16, mask16, bias.half(), softmax_dtype)
        return masked_attention(hidden, hidden, hidden, mask16, bias.half(), softmax_dtype), hidden

    summed = mask16 + bias.half()
    broken_out, broken_hidden = two_layers(None)
    fixed_out, fixed_hidden = two_layers(torch.float32)
    mask32 = _left_padded_causal_mask(length, padding, torch.float16).float()
    ref_hidden = masked_attention(q, k, v, mask32, bias)
    ref_out = masked_attention(ref_hidden, ref_hidden, ref_hidden, mask32, bias)
    nan_rows = lambda t: int(torch.isnan(t).any(dim=-1).sum())  # noqa: E731
    before = {"mask_value": torch.finfo(torch.float16).min, "bias": -20.0,
              "mask_plus_bias_in_fp16": summed[0, -1].item(),
              "neg_inf_entries": int(torch.isneginf(summed).sum()),
              "fully_masked_rows": padding, "nan_rows_layer1": nan_rows(broken_hidden),
              "nan_rows_layer2": nan_rows(broken_out), "rows": length}
    after = {"nan_rows_layer1": nan_rows(fixed_hidden), "nan_rows_layer2": nan_rows(fixed_out),
             "max_abs_error_vs_fp32": (fixed_out.float() - ref_out).abs().max().item(),
             "cuda_autocast_softmax": policy_for("cuda").category("softmax"),
             "cpu_autocast_softmax": policy_for("cpu").category("softmax")}
    return Case(
        3, "Attention mask finfo(fp16).min plus a negative bias: -inf, then NaN",
        symptom="NaN in the attention output of padded rows, and one layer later in every row",
        cause="-65504 + (-20) is beyond fp16's range and rounds to -inf; a row whose entries are "
              "all -inf has softmax 0/0 = NaN, and as keys and values those NaN rows reach every "
              "query of the next layer",
        fix="add the mask and bias and take the softmax in fp32 (CUDA autocast runs softmax in "
            "fp32; it cannot undo an add that already overflowed in fp16)",
        references=("pytorch #60939", "transformers #17433", "transformers #17306"),
        before=before, after=after,
        evidence=(f"fp16 mask + bias = {before['mask_plus_bias_in_fp16']}: NaN rows "
                  f"{before['nan_rows_layer1']}/{length} after layer 1, "
                  f"{before['nan_rows_layer2']}/{length} after layer 2; fp32 softmax: 0 NaN rows, "
                  f"max error {after['max_abs_error_vs_fp32']:.1e} vs fp32"))


# ---------------------------------------------------------------------------------------------
# Case 4: fp16 parameters handed to GradScaler.

def _tiny_mlp(dtype: torch.dtype = torch.float32, seed: int = 4) -> nn.Module:
    with _seeded(seed):
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(dtype)


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


def case_04_fp16_parameters(steps: int = 20) -> Case:
    """GradScaler refuses fp16 gradients; FP32 master weights give it FP32 ones."""
    x, y = _regression_data(8, 4, 16, seed=4)
    errors = {}
    for name, scaler in (("torch", torch.amp.GradScaler("cpu")), ("mpcourse", GradScaler())):
        model = _tiny_mlp(torch.float16)
        errors[name] = _scaler_error(scaler, model, torch.optim.SGD(model.parameters(), lr=0.1),
                                     x.half(), y)
    bf16_model = _tiny_mlp(torch.bfloat16)
    bf16_error = _scaler_error(torch.amp.GradScaler("cpu"), bf16_model,
                               torch.optim.SGD(bf16_model.parameters(), lr=0.1), x.bfloat16(), y)
    model = _tiny_mlp(torch.float16)
    optimizer = MasterWeightOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    losses, skipped = [], 0
    for _ in range(steps):
        loss = F.mse_loss(model(x.half()).float(), y)
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped += _scale_dropped(scaler, before)
        optimizer.zero_grad()
        losses.append(loss.item())
    before = {"torch_error": errors["torch"], "mpcourse_error": errors["mpcourse"],
              "bf16_parameters_error": bf16_error}
    after = {"error": None, "first_loss": losses[0], "last_loss": losses[-1], "steps": steps,
             "skipped_steps": skipped,
             "master_dtypes": sorted({str(p.dtype) for p in optimizer.master_parameters()}),
             "working_dtypes": sorted({str(p.dtype) for p in model.parameters()})}
    return Case(
        4, 'GradScaler with fp16 parameters: "Attempting to unscale FP16 gradients."',
        symptom='ValueError: Attempting to unscale FP16 gradients. (at scaler.step or unscale_)',
        cause="the model itself is fp16 (model.half()), so its gradients are fp16; dividing them "
              "by the scale in fp16 would flush small ones to zero, so the scaler refuses",
        fix="keep FP32 parameters and use autocast, or give the scaler an optimizer over FP32 "
            "master weights (MasterWeightOptimizer)",
        references=("LLaVA #363", "AdaFace #127"),
        before=before, after=after,
        evidence=(f"torch and mpcourse raise '{errors['torch'].split(': ', 1)[1]}'; with FP32 "
                  f"masters: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {steps} steps"))


# ---------------------------------------------------------------------------------------------
# Case 5: clipping before unscale_.

def _clip_step(order: str, max_norm: float, scaler=None) -> tuple[nn.Module, float]:
    """One clipped SGD step (lr=1); returns the model and the norm of the gradient it applied.

    order: "clip_then_unscale" (the mistake), "unscale_then_clip" (right) or "no_scaler" (the
    FP32 reference).
    """
    model = _tiny_mlp(seed=5)
    x, y = _regression_data(8, 4, 16, seed=5, target_scale=4.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loss = F.mse_loss(model(x), y)
    if order == "no_scaler":
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        if order == "unscale_then_clip":
            scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)  # unscales here if unscale_ was not called
        scaler.update()
    applied = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    return model, applied.item()


def true_gradient_norm(seed: int = 5) -> float:
    """The FP32 gradient norm of case 5's model before any clipping."""
    model = _tiny_mlp(seed=seed)
    x, y = _regression_data(8, 4, 16, seed=seed, target_scale=4.0)
    F.mse_loss(model(x), y).backward()
    return nn.utils.clip_grad_norm_(model.parameters(), math.inf).item()


def case_05_clip_before_unscale(max_norm: float = 1.0) -> Case:
    """Clipping scaled gradients clips at max_norm / scale: the update shrinks 65536-fold."""
    scale = 2.0**16
    reference, reference_norm = _clip_step("no_scaler", max_norm)
    wrong, wrong_norm = _clip_step("clip_then_unscale", max_norm, torch.amp.GradScaler("cpu"))
    right, right_norm = _clip_step("unscale_then_clip", max_norm, torch.amp.GradScaler("cpu"))
    equal = lambda a, b: all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))  # noqa: E731
    before = {"true_grad_norm": true_gradient_norm(), "max_norm": max_norm, "scale": scale,
              "applied_grad_norm": wrong_norm, "effective_max_norm": max_norm / scale,
              "matches_fp32_reference": equal(wrong, reference)}
    after = {"applied_grad_norm": right_norm, "reference_grad_norm": reference_norm,
             "matches_fp32_reference": equal(right, reference)}
    return Case(
        5, "Clipping before unscale_: the threshold is off by the scale",
        symptom="training crawls: every update is tiny, although the loss and scale look normal",
        cause="clip_grad_norm_ saw gradients multiplied by the scale (65536), so it clipped them "
              "to max_norm and the scaler then divided by 65536: the effective threshold is "
              "max_norm / scale",
        fix="scaler.unscale_(optimizer), then clip, then scaler.step(optimizer), scaler.update()",
        references=("Pytorch-UNet #468", "returnn #1590", "pytorch/examples #1196"),
        before=before, after=after,
        evidence=(f"true norm {before['true_grad_norm']:.2f}, max_norm {max_norm}: applied norm "
                  f"{wrong_norm:.2e} (= {max_norm}/65536) when clipped first, {right_norm:.4f} "
                  f"after unscale_, bitwise equal to the FP32 reference"))


# ---------------------------------------------------------------------------------------------
# Case 6: unscale_ twice with gradient accumulation.

def _accumulated_step(scaler, micro_batches: int, unscale_each_micro_batch: bool,
                      max_norm: float = 1.0) -> tuple[nn.Module, str | None]:
    model = _tiny_mlp(seed=6)
    x, y = _regression_data(8, 4, 16, seed=6, target_scale=4.0)
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
    return Case(
        6, "unscale_ called twice with gradient accumulation",
        symptom="RuntimeError: unscale_() has already been called on this optimizer since the "
                "last update().",
        cause="unscale_ (often hidden inside a clipping helper) ran for every micro-batch, but "
              "the gradients belong to one step: they may be unscaled once per update()",
        fix="accumulate all micro-batches, then unscale_ once, clip, step and update",
        references=("transformers #23935", "transformers #24449"),
        before=before, after=after,
        evidence=(f"torch and mpcourse raise at the 2nd of {micro_batches} micro-batches; "
                  f"unscale_ once: parameters within {difference:.1e} of the FP32 reference"))


# ---------------------------------------------------------------------------------------------
# Case 7: resuming without the scaler's state.

def _resumable_run(steps: int, scaler_state: dict | None = None, model_state=None,
                   optimizer_state=None, first_step: int = 0, stop_after: int | None = None):
    """fp16-autocast training whose settled scale is below 2**16; can stop and resume."""
    with _seeded(7):
        model = nn.Linear(8, 8)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    if model_state is not None:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(copy.deepcopy(optimizer_state))  # Adam would alias its tensors
    if scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    skipped = []
    end = steps if stop_after is None else stop_after
    for step in range(first_step, end):
        x, y = _regression_data(8, 8, 16, seed=100 + step, target_scale=4.0)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y, reduction="sum")
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if _scale_dropped(scaler, before):
            skipped.append(step)
    checkpoint = {"model": copy.deepcopy(model.state_dict()),
                  "optimizer": copy.deepcopy(optimizer.state_dict()),
                  "scaler": scaler.state_dict()}
    return model, skipped, checkpoint


def case_07_resume_without_scaler_state(steps: int = 40, stop_at: int = 20) -> Case:
    """A resumed run that forgot the scaler restarts at 2**16 and skips steps to find it again."""
    full, full_skipped, _ = _resumable_run(steps)
    _, first_half_skipped, ckpt = _resumable_run(steps, stop_after=stop_at)
    forgot, forgot_skipped, forgot_end = _resumable_run(steps, None, ckpt["model"], ckpt["optimizer"],
                                                        stop_at)
    kept, kept_skipped, _ = _resumable_run(steps, ckpt["scaler"], ckpt["model"], ckpt["optimizer"],
                                           stop_at)
    difference = lambda m: max((p - q).abs().max().item()  # noqa: E731
                               for p, q in zip(m.parameters(), full.parameters()))
    after_stop = [s for s in full_skipped if s >= stop_at]
    before = {"scale_at_checkpoint": ckpt["scaler"]["scale"], "scale_after_resume": 2.0**16,
              "skipped_after_resume": len(forgot_skipped),
              "scale_at_end": forgot_end["scaler"]["scale"],
              "uninterrupted_skipped_after_stop": len(after_stop),
              "max_param_difference_vs_uninterrupted": difference(forgot)}
    after = {"skipped_after_resume": len(kept_skipped),
             "max_param_difference_vs_uninterrupted": difference(kept),
             "bitwise_equal_to_uninterrupted": difference(kept) == 0.0}
    return Case(
        7, "Resuming without the scaler's state",
        symptom="right after a resume, several steps are skipped (or the loss jumps) although "
                "the run was stable before the checkpoint",
        cause="the checkpoint held the model and optimizer but not the scaler, so the resumed "
              "run starts again at 2**16 and must overflow its way back down",
        fix='save scaler.state_dict() with the checkpoint and load it on resume',
        references=("transformers PR #11663", "fairseq2 #1346", "accelerate #4289"),
        before=before, after=after,
        evidence=(f"scale at checkpoint {ckpt['scaler']['scale']:g}; resumed at 2**16: "
                  f"{len(forgot_skipped)} steps skipped; with the scaler state: "
                  f"{len(kept_skipped)} skipped, bitwise equal to the uninterrupted run"))


# ---------------------------------------------------------------------------------------------
# Case 8: autocast on a CPU without bf16 instructions is slower than FP32.

@dataclass(frozen=True)
class SpeedPrediction:
    """Whether autocast to `dtype` should beat FP32 on this hardware, and the reason."""
    dtype: str
    device_type: str
    faster_than_fp32: bool
    reason: str


def predict_autocast_speed(report: hardware.HardwareReport, dtype: str = "bf16") -> SpeedPrediction:
    """Predict from `mpcourse.hardware.report()` whether 16-bit autocast speeds matmuls up here.

    16-bit matmuls are faster only where hardware computes in 16 bits: tensor cores on a GPU,
    AVX512-BF16/AMX (or AVX512-FP16) on a CPU. Elsewhere each 16-bit value is converted to FP32
    and back around every operation, which costs more than doing the whole thing in FP32.
    """
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype must be 'bf16' or 'fp16', got {dtype!r}")
    support = report.precisions[dtype]
    if support.accelerated:
        reason = f"{dtype} is accelerated here ({support.how}): expect autocast to be faster"
    else:
        reason = f"{dtype} is not accelerated here ({support.how}): expect autocast to be slower"
    return SpeedPrediction(dtype, report.device_type, support.accelerated, reason)


@contextlib.contextmanager
def _threads(count: int | None):
    """Run the block on `count` CPU threads (None: leave torch's setting alone)."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def case_08_cpu_autocast_slowdown(size: int = 256, dtype: str = "bf16", repeats: int = 5,
                                  report: hardware.HardwareReport | None = None,
                                  threads: int | None = 1) -> Case:
    """Predict, then time, one forward+backward of a linear layer in FP32 and under autocast.

    The CPU timing runs on `threads` threads (default 1): on a busy machine, multi-threaded
    kernels spend their time waiting for each other, which would swamp the arithmetic we compare.
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    report = report or hardware.report()
    prediction = predict_autocast_speed(report, dtype)
    device = "cuda" if report.device_type == "cuda" else "cpu"
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    with _seeded(8):
        layer = nn.Linear(size, size).to(device)
        x = torch.randn(size, size, device=device)

    def step(enabled: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.autocast(device, dtype=low, enabled=enabled):
                out = layer(x)
            out.float().sum().backward()
            layer.zero_grad(set_to_none=True)
        return run

    with _threads(threads if device == "cpu" else None):
        timing = compare(step(False), step(True), name_a="fp32", name_b=f"{dtype} autocast",
                         warmup=1, repeats=repeats, device=device)
    before = {"predicted_faster": prediction.faster_than_fp32, "prediction": prediction.reason,
              "autocast_seconds": timing.seconds_b, "fp32_seconds": timing.seconds_a,
              "slowdown": timing.ratio, "size": size, "device": device,
              "threads": threads if device == "cpu" else None}
    after = {"fp32_seconds": timing.seconds_a,
             "advice": ("keep FP32 (or use the GPU) on this machine" if not prediction.faster_than_fp32
                        else f"autocast to {dtype} pays off here")}
    return Case(
        8, f"{dtype} autocast slower than FP32 on a CPU without 16-bit instructions",
        symptom="the step is many times slower with autocast than without, on a CPU",
        cause="without AVX512-BF16/AMX (bf16) or AVX512-FP16 (fp16), the CPU converts every "
              "16-bit value to FP32 and back around each operation",
        fix="check mpcourse doctor first; on such a CPU train in FP32 and keep 16 bits for the "
            "GPU (tensor cores) or a CPU with AVX512-BF16/AMX, where 16-bit matmuls are faster",
        references=("pytorch #118499", "pytorch #86270"),
        before=before, after=after,
        evidence=(f"predicted {'faster' if prediction.faster_than_fp32 else 'slower'}; measured "
                  f"{size}x{size} step: {dtype} autocast takes {timing.ratio:.1f}x the FP32 time"))


# ---------------------------------------------------------------------------------------------
# Case 9: the autocast weight cache goes stale when weights change inside one region.

def _stale_cache_run(steps: int, loop_inside_region: bool, autocast_cls=torch.autocast):
    with _seeded(9):
        model = nn.Linear(8, 1)
    x, y = _regression_data(8, 1, 32, seed=9)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []

    def one_step() -> None:
        loss = F.mse_loss(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    if loop_inside_region:
        with autocast_cls("cpu", dtype=torch.bfloat16):
            for _ in range(steps):
                one_step()
    else:
        for _ in range(steps):
            with autocast_cls("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x).float(), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    with torch.no_grad():  # the loss of the weights the run really ended with, in fp32
        true_loss = F.mse_loss(model(x), y).item()
    return losses, true_loss


def case_09_stale_weight_cache(steps: int = 20) -> Case:
    """Train inside one autocast region: the forward keeps using the first bf16 weight copy."""
    stale, stale_true = _stale_cache_run(steps, loop_inside_region=True)
    ours, _ = _stale_cache_run(steps, loop_inside_region=True, autocast_cls=mpcourse_autocast)
    fresh, fresh_true = _stale_cache_run(steps, loop_inside_region=False)
    before = {"first_loss": stale[0], "last_loss": stale[-1],
              "distinct_losses": len(set(stale)), "true_final_loss": stale_true,
              "mpcourse_autocast_same": ours == stale}
    after = {"first_loss": fresh[0], "last_loss": fresh[-1], "true_final_loss": fresh_true}
    return Case(
        9, "Stale autocast weight cache: weights updated inside one autocast region",
        symptom="the loss printed is the same number every step, while the real weights drift "
                "(their true loss is far worse)",
        cause="inside one autocast region each FP32 weight is cast to bf16 once and the copy is "
              "reused; optimizer.step() changes the FP32 weight in place, the cached copy does "
              "not follow",
        fix="open a fresh autocast region for each forward pass (the cache empties when the "
            "region exits), or autocast(..., cache_enabled=False)",
        references=("pytorch #86136", "anemoi-core #134"),
        before=before, after=after,
        evidence=(f"loop inside one region: loss {stale[0]:.3f} every step ({len(set(stale))} "
                  f"distinct value), true loss of the final weights {stale_true:.1f}; one "
                  f"region per step: {fresh[0]:.3f} -> {fresh[-1]:.4f}"))


# ---------------------------------------------------------------------------------------------
# Case 10: pure bf16 training without master weights.

@torch.no_grad()
def sgd_step_stochastic(params, lr: float, generator: torch.Generator | None = None) -> None:
    """Plain SGD on bf16 parameters, computing `p - lr * grad` in FP32 and rounding stochastically.

    Rounding up with probability equal to how far the exact result lies towards the next bf16
    value makes the stored weight right on average, so updates far smaller than bf16's spacing
    still move the weights over many steps: an alternative to an FP32 master copy that costs no
    memory (it is what some bf16 optimizers offer).
    """
    for p in params:
        if p.dtype != torch.bfloat16:
            raise ValueError(f"sgd_step_stochastic updates bf16 parameters, got {p.dtype}")
        if p.grad is None:
            continue
        exact = p.float() - lr * p.grad.float()
        p.copy_(round_to(exact, BF16, rounding="stochastic", generator=generator))


def _bf16_regression(update: str, steps: int, lr: float, n: int = 32):
    """Fit y = X w_true with bf16 weights near 1; `update` is "bf16", "master" or "stochastic"."""
    g = torch.Generator().manual_seed(10)
    w_init = 1.0 + 0.1 * torch.rand(n, generator=g)
    w_true = w_init + 0.05 * (2 * torch.rand(n, generator=g) - 1)
    x = torch.randn(64, n, generator=g)
    y = x @ w_true
    weight = nn.Parameter(w_init.bfloat16())
    start = weight.detach().clone()
    optimizer = None
    if update == "bf16":
        optimizer = torch.optim.SGD([weight], lr=lr)
    elif update == "master":
        optimizer = MasterWeightOptimizer([weight], torch.optim.SGD, lr=lr)
    rounding = torch.Generator().manual_seed(11)
    for _ in range(steps):
        loss = F.mse_loss((x.bfloat16() @ weight).float(), y)
        weight.grad = None
        if optimizer is not None:
            optimizer.zero_grad()
        loss.backward()
        if update == "stochastic":
            sgd_step_stochastic([weight], lr, rounding)
        else:
            optimizer.step()
    never_moved = (weight.detach() == start).float().mean().item()
    final = F.mse_loss(x @ weight.detach().float(), y).item()
    initial = F.mse_loss(x @ start.float(), y).item()
    return {"never_moved": never_moved, "initial_loss": initial, "final_loss": final}


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
    return Case(
        10, "Pure bf16 training without master weights: small updates vanish",
        symptom="the loss stops falling early; most weights are bit-for-bit unchanged after "
                "hundreds of steps",
        cause="near 1.0 bf16 values are 2**-7 apart, so an update smaller than 2**-8 rounds "
              "straight back to the old weight",
        fix="keep FP32 master weights (MasterWeightOptimizer), or round the update "
            "stochastically (formats.round_to(..., rounding='stochastic'))",
        references=("pytorch/ao PR #1124",),
        before=before, after=after,
        evidence=(f"pure bf16: {pure['never_moved']:.0%} of weights never moved, loss "
                  f"{pure['initial_loss']:.3f} -> {pure['final_loss']:.3f}; FP32 masters: "
                  f"{master['final_loss']:.4f}; stochastic rounding: {stochastic['final_loss']:.4f}"))


# ---------------------------------------------------------------------------------------------
# Case 11: backward inside autocast, and model.half() against autocast.

def case_11_half_model_vs_autocast(lr: float = 1e-3) -> Case:
    """model.half() and fp16 autocast compute the same forward; they differ in what they store.

    Also checks that a backward pass run inside the autocast region gives the same gradients
    as one run after it (true in eager mode: backward ops use the dtypes the forward recorded).
    """
    x, y = _regression_data(8, 4, 16, seed=11, target_scale=1.0)
    grads = {}
    for inside in (False, True):
        model = _tiny_mlp(seed=11)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        grads[inside] = [p.grad.clone() for p in model.parameters()]
    backward_same = all(torch.equal(a, b) for a, b in zip(grads[False], grads[True]))

    half = _tiny_mlp(seed=11).half()
    try:
        half(x)
        half_error = None
    except RuntimeError as error:
        half_error = f"{type(error).__name__}: {error}"
    amp = _tiny_mlp(seed=11)
    half_loss = F.mse_loss(half(x.half()).float(), y)
    with torch.autocast("cpu", dtype=torch.float16):
        amp_loss = F.mse_loss(amp(x), y)
    moved = {}
    for name, model, loss in (("half", half, half_loss), ("autocast", amp, amp_loss)):
        start = [p.detach().clone() for p in model.parameters()]
        loss.backward()
        torch.optim.SGD(model.parameters(), lr=lr).step()
        changed = sum(int((p.detach() != q).sum()) for p, q in zip(model.parameters(), start))
        moved[name] = changed / sum(q.numel() for q in start)
    nbytes = lambda m: sum(p.nbytes for p in m.parameters())  # noqa: E731
    first = lambda m: next(m.parameters())  # noqa: E731
    before = {"half_fp32_input_error": half_error, "half_param_dtype": str(first(half).dtype),
              "half_grad_dtype": str(first(half).grad.dtype), "half_param_bytes": nbytes(half),
              "half_fraction_moved_by_one_step": moved["half"]}
    after = {"autocast_param_dtype": str(first(amp).dtype),
             "autocast_grad_dtype": str(first(amp).grad.dtype), "autocast_param_bytes": nbytes(amp),
             "autocast_fraction_moved_by_one_step": moved["autocast"],
             "forward_losses_bitwise_equal": half_loss.item() == amp_loss.item(),
             "backward_inside_autocast_bitwise_equal": backward_same}
    return Case(
        11, "model.half() against autocast, and backward inside autocast",
        symptom='"mat1 and mat2 must have the same dtype" (older torch: "expected scalar type '
                'Half but found Float") after model.half(); later, updates that vanish and fp16 '
                'gradients that GradScaler refuses',
        cause="model.half() converts the parameters themselves, so gradients and optimizer "
              "updates are fp16 too; autocast keeps FP32 parameters and casts per op",
        fix="keep the model in FP32 and wrap forward and loss in autocast; backward inside the "
            "region gives the same gradients in eager mode, but belongs outside it",
        references=("pytorch #42358", "pytorch #38487", "pytorch #120930", "pytorch #153044"),
        before=before, after=after,
        evidence=(f"same forward loss ({'bitwise' if after['forward_losses_bitwise_equal'] else 'not bitwise'}); "
                  f"one SGD step (lr {lr:g}) moves {moved['half']:.0%} of the fp16 weights, "
                  f"{moved['autocast']:.0%} of the FP32 ones; backward inside autocast: gradients "
                  f"{'bitwise equal' if backward_same else 'differ'}"))


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
    return Case(
        12, "Deprecated torch.cuda.amp.* and torch.cpu.amp.* APIs",
        symptom="FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated (one per "
                "old call)",
        cause="the device-specific namespaces were folded into torch.amp, which takes the "
              "device as an argument",
        fix="torch.amp.autocast(device_type), torch.amp.GradScaler(device_type), "
            "torch.amp.custom_fwd/custom_bwd(device_type=...)",
        references=("torch/amp/autocast_mode.py", "torch/cuda/amp/grad_scaler.py"),
        before=before, after=after,
        evidence=f"{len(old)} FutureWarnings from the old calls, {len(new)} from torch.amp")


CASES = (case_01_scale_collapse, case_02_fp16_overflow, case_03_attention_mask_overflow,
         case_04_fp16_parameters, case_05_clip_before_unscale, case_06_unscale_twice,
         case_07_resume_without_scaler_state, case_08_cpu_autocast_slowdown,
         case_09_stale_weight_cache, case_10_pure_bf16_updates, case_11_half_model_vs_autocast,
         case_12_deprecated_apis)


def run_all(**case_08_kwargs: Any) -> list[Case]:
    """Every case, in order (keyword arguments go to case 8, the one that times things).

    Cases 13 to 17 live in `mpcourse.clinic_more`, which builds on this module's `Case`.
    """
    from mpcourse.clinic_more import CASES as MORE_CASES
    return [case(**case_08_kwargs) if case is case_08_cpu_autocast_slowdown else case()
            for case in CASES + MORE_CASES]


def table(cases: list[Case]) -> str:
    """The closing symptom -> cause -> fix table, as Markdown, one row per case."""
    if not cases:
        raise ValueError("table needs at least one Case, got none")
    rows = ["| # | symptom | cause | fix | measured here |", "|---|---|---|---|---|"]
    for c in cases:
        cells = (escape_markdown(text) for text in (c.symptom, c.cause, c.fix, c.evidence))
        rows.append(f"| {c.number} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def escape_markdown(text: str) -> str:
    """`text` made safe for one Markdown table cell: pipes and asterisks (2**16) kept literal."""
    return text.replace("|", "\\|").replace("*", "\\*").replace("\n", " ")
