"""Issue 43, point 2: the yardsticks of lessons 04, 05 and 08 follow the size that ran.

Each lesson switches to a GPU size on a GPU (`hardware.scaled`). An assertion tuned at the CPU
size can then fail for no fault of the mechanism; these tests show, at the GPU size, that the
old threshold fails and the computed one holds, using exact or fast computations where the GPU
size is too slow for two CPU cores.
"""
import math

import pytest
import torch

from mpcourse.amp import MasterWeightOptimizer
from mpcourse.amp.fine_tune_forecast import forecast_fine_tune

LR = 0.05
CPU_SIZE, GPU_SIZE = (32, 600), (256, 2000)   # lesson 04's (DIM, STEPS), cpu and cuda


def lesson04_data(dim):
    """Lesson 04 §3's data, drawn exactly as cell 2ea09a45 draws it."""
    generator = torch.Generator().manual_seed(0)
    W0 = torch.randn(dim, dim, generator=generator)
    W_target = W0 + 0.01 * torch.randn(dim, dim, generator=generator)
    X = torch.randn(8 * dim, dim, generator=generator)
    return X, X @ W_target.T, W0, W_target


def fine_tune(X, Y, W0, dtype, use_masters, steps):
    """Lesson 04's run, with torch's own SGD: the losses per step and the final weight."""
    weight = torch.nn.Parameter(W0.to(dtype, copy=True))
    optimizer = (MasterWeightOptimizer([weight], torch.optim.SGD, lr=LR) if use_masters
                 else torch.optim.SGD([weight], lr=LR))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (X.to(dtype) @ weight.T).float().sub(Y).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, weight.detach()


def emulated_fp16_final_loss(X, Y, W0, steps):
    """The last loss of the run with FP16 weights updated directly, in FP32 arithmetic rounded to
    FP16 wherever the FP16 run stores a tensor: fast where CPU FP16 matmuls are not."""
    x16 = X.half().float()
    weight = W0.half().float()
    scale = 2 / Y.numel()
    for _ in range(steps):
        out = (x16 @ weight.T).half().float()
        residual = out - Y
        grad_out = (scale * residual).half().float()
        grad = (grad_out.T @ x16).half().float()
        weight = (weight - LR * grad).half().float()
    return residual.pow(2).mean().item()


def test_forecast_matches_the_three_runs_at_a_small_size():
    """The closed form is the FP32 run; the stuck weights are the ones the FP16 run never moves."""
    dim, steps = 24, 300
    X, Y, W0, W_target = lesson04_data(dim)
    forecast = forecast_fine_tune(X, W0, W_target, LR, steps)
    fp32, _ = fine_tune(X, Y, W0, torch.float32, False, steps)
    pure, pure_w = fine_tune(X, Y, W0, torch.float16, False, steps)
    master, master_w = fine_tune(X, Y, W0, torch.float16, True, steps)
    assert math.isclose(fp32[-1], forecast.fp32_loss, rel_tol=1e-3)
    assert (pure_w != W0.half()).double().mean().item() == pytest.approx(1 - forecast.stuck_share, abs=0.02)
    assert (master_w != W0.half()).double().mean().item() == pytest.approx(forecast.master_moved_share,
                                                                         abs=0.02)
    assert forecast.stuck_loss / 2 < pure[-1] < fp32[0]
    assert master[-1] < 1.2 * fp32[-1]


def test_emulation_reproduces_the_fp16_run():
    """The fast emulation used at the GPU size gives the real FP16 run's last loss."""
    X, Y, W0, _ = lesson04_data(CPU_SIZE[0])
    real, _ = fine_tune(X, Y, W0, torch.float16, False, CPU_SIZE[1])
    assert emulated_fp16_final_loss(X, Y, W0, CPU_SIZE[1]) == pytest.approx(real[-1], rel=0.02)


def test_lesson04_yardstick_at_the_gpu_size():
    """At DIM 256 and 2,000 steps the old `pure > 10 x master` fails for any run that merely
    stays below its starting loss, while the forecast's yardstick holds for the emulated run."""
    X, Y, W0, W_target = lesson04_data(GPU_SIZE[0])
    forecast = forecast_fine_tune(X, W0, W_target, LR, GPU_SIZE[1])
    start_loss = (X @ W0.T - Y).pow(2).mean().item()
    assert start_loss < 10 * forecast.fp32_loss            # old: even a frozen layer would fail it
    cpu = forecast_fine_tune(*(lesson04_data(CPU_SIZE[0])[i] for i in (0, 2, 3)), LR, CPU_SIZE[1])
    assert cpu.stall_ratio > 10 > forecast.stall_ratio     # the gap shrinks with the size
    pure = emulated_fp16_final_loss(X, Y, W0, GPU_SIZE[1])
    assert pure > forecast.stuck_loss / 2                  # new: the floor, and the ratio
    assert pure > 1.2 * forecast.fp32_loss * forecast.stall_ratio / 2


def test_forecast_refuses_impossible_runs():
    X, _, W0, W_target = lesson04_data(4)
    with pytest.raises(ValueError, match="steps=0"):
        forecast_fine_tune(X, W0, W_target, LR, 0)
    with pytest.raises(ValueError, match=r"\(32, 4\)"):
        forecast_fine_tune(X, W0, W_target[:, :2], LR, 10)
