"""Clinic cases of lesson 03, autocast: 8, 9 and 11.

Autocast on a CPU without 16-bit instructions (case 8), its weight cache going stale when the
weights change inside one region (case 9), and `model.half()` in its place (case 11).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.machine import hardware
from mpcourse.amp.autocast_mode import autocast as mpcourse_autocast
from mpcourse.machine.benchmark import compare
from mpcourse.clinic.case import Case, diagnosed, regression_data, seeded, tiny_mlp
from mpcourse.numbers.precision import autocast_dtype


# ---------------------------------------------------------------------------------------------
# Case 8: autocast on a CPU without bf16 instructions is slower than FP32.

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


CPU_AUTOCAST_SLOWDOWN = """
{dtype} autocast slower than FP32 on a CPU without 16-bit instructions
symptom: the step is many times slower with autocast than without, on a CPU
cause: without 16-bit instructions (AVX512-BF16/AMX or ARM's BF16 for bf16; AVX512-FP16 or ARM's
    FP16 for fp16), the CPU converts every 16-bit value to FP32 and back around each operation
fix: check mpcourse doctor first; on such a CPU train in FP32 and keep 16 bits for the GPU
    (tensor cores) or a CPU that has them, where 16-bit matmuls are faster
references: pytorch #118499; pytorch #86270
"""


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
    prediction = hardware.predict_autocast_speed(report, dtype)
    device = "cuda" if report.device_type == "cuda" else "cpu"
    low = autocast_dtype(dtype)
    with seeded(8):
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
    evidence = (f"predicted {'faster' if prediction.faster_than_fp32 else 'slower'}; measured "
                f"{size}x{size} step: {dtype} autocast takes {timing.ratio:.1f}x the FP32 time")
    return diagnosed(8, CPU_AUTOCAST_SLOWDOWN, before, after, evidence, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Case 9: the autocast weight cache goes stale when weights change inside one region.

def _stale_cache_run(steps: int, loop_inside_region: bool, autocast_cls=torch.autocast):
    with seeded(9):
        model = nn.Linear(8, 1)
    x, y = regression_data(8, 1, 32, seed=9)
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


STALE_WEIGHT_CACHE = """
Stale autocast weight cache: weights updated inside one autocast region
symptom: the loss printed is the same number every step, while the real weights drift (their
    true loss is far worse)
cause: inside one autocast region each FP32 weight is cast to bf16 once and the copy is reused;
    optimizer.step() changes the FP32 weight in place, the cached copy does not follow
fix: open a fresh autocast region for each forward pass (the cache empties when the region
    exits), or autocast(..., cache_enabled=False)
references: pytorch #86136; anemoi-core #134
"""


def case_09_stale_weight_cache(steps: int = 20) -> Case:
    """Train inside one autocast region: the forward keeps using the first bf16 weight copy."""
    stale, stale_true = _stale_cache_run(steps, loop_inside_region=True)
    ours, _ = _stale_cache_run(steps, loop_inside_region=True, autocast_cls=mpcourse_autocast)
    fresh, fresh_true = _stale_cache_run(steps, loop_inside_region=False)
    before = {"first_loss": stale[0], "last_loss": stale[-1],
              "distinct_losses": len(set(stale)), "true_final_loss": stale_true,
              "mpcourse_autocast_same": ours == stale}
    after = {"first_loss": fresh[0], "last_loss": fresh[-1], "true_final_loss": fresh_true}
    evidence = (f"loop inside one region: loss {stale[0]:.3f} every step ({len(set(stale))} "
                f"distinct value), true loss of the final weights {stale_true:.1f}; one "
                f"region per step: {fresh[0]:.3f} -> {fresh[-1]:.4f}")
    return diagnosed(9, STALE_WEIGHT_CACHE, before, after, evidence)


# ---------------------------------------------------------------------------------------------
# Case 11: backward inside autocast, and model.half() against autocast.

HALF_MODEL_VS_AUTOCAST = """
model.half() against autocast, and backward inside autocast
symptom: "mat1 and mat2 must have the same dtype" (older torch: "expected scalar type Half but
    found Float") after model.half(); later, updates that vanish and fp16 gradients that
    GradScaler refuses
cause: model.half() converts the parameters themselves, so gradients and optimizer updates are
    fp16 too; autocast keeps FP32 parameters and casts per op
fix: keep the model in FP32 and wrap forward and loss in autocast; backward inside the region
    gives the same gradients in eager mode, but belongs outside it
references: pytorch #42358; pytorch #38487; pytorch #120930; pytorch #153044
"""


def case_11_half_model_vs_autocast(lr: float = 1e-3) -> Case:
    """model.half() and fp16 autocast compute the same forward; they differ in what they store.

    Also checks that a backward pass run inside the autocast region gives the same gradients
    as one run after it (true in eager mode: backward ops use the dtypes the forward recorded).
    """
    x, y = regression_data(8, 4, 16, seed=11, target_scale=1.0)
    grads = {}
    for inside in (False, True):
        model = tiny_mlp(seed=11)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        grads[inside] = [p.grad.clone() for p in model.parameters()]
    backward_same = all(torch.equal(a, b) for a, b in zip(grads[False], grads[True]))

    half = tiny_mlp(seed=11).half()
    try:
        half(x)
        half_error = None
    except RuntimeError as error:
        half_error = f"{type(error).__name__}: {error}"
    amp = tiny_mlp(seed=11)
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
    forward = "bitwise" if after["forward_losses_bitwise_equal"] else "not bitwise"
    backward = "bitwise equal" if backward_same else "differ"
    evidence = (f"same forward loss ({forward}); one SGD step (lr {lr:g}) moves {moved['half']:.0%} "
                f"of the fp16 weights, {moved['autocast']:.0%} of the FP32 ones; backward inside "
                f"autocast: gradients {backward}")
    return diagnosed(11, HALF_MODEL_VS_AUTOCAST, before, after, evidence)
