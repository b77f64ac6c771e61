"""What lesson 04's fine-tuning experiment should show, computed before it runs (lesson 04, §3).

The experiment trains a layer W from `W0` towards `W_target` by plain gradient descent on the
mean squared error of `X @ W.T` against `Y = X @ W_target.T`. That is a least-squares problem,
so its FP32 run has a closed form. With E = W - W_target and H = X^T X / N, the gradient of the
mean over N x out values is (2 / out) E H, and every step multiplies E by (I - 2 lr H / out):
along an eigenvector of H with eigenvalue lam, the error shrinks by (1 - 2 lr lam / out) per
step and the loss by its square. The loss after `steps` steps follows from the eigenvalues alone,
which is why the gap between the runs depends on lr, the layer's size and the step count, and a
yardstick tuned at one size (say "10 times") fails at another.

FP16 weights updated directly keep a weight unchanged when its update is below half the FP16
spacing at that weight (lesson 04, §1). `forecast_fine_tune` marks the weights whose *first*
update already rounds away as stuck and computes the smallest loss the layer can reach while they
stay where they started (the others set to their best values): the floor the stalled run sits on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FineTuneForecast:
    """The fine-tuning run's outcome predicted from its data, lr and step count."""

    fp32_loss: float            # the FP32 run's final loss, from the closed form
    stuck_share: float          # share of FP16 weights whose first direct update rounds away
    stuck_loss: float           # the lowest loss reachable with those weights left at W0
    master_moved_share: float   # share of FP16 copies that the FP32 run's final weights change

    @property
    def stall_ratio(self) -> float:
        """How many times the stalled run's loss should exceed the FP32 (and master) run's."""
        return self.stuck_loss / self.fp32_loss


def forecast_fine_tune(X: torch.Tensor, W0: torch.Tensor, W_target: torch.Tensor, lr: float,
                       steps: int) -> FineTuneForecast:
    """Predict lesson 04's three fine-tuning runs (SGD with `lr` for `steps` steps from `W0`
    towards `W_target` on inputs `X`), in float64 from the eigenvalues of X^T X / N."""
    if steps < 1 or lr <= 0:
        raise ValueError(f"steps must be at least 1 and lr positive, got steps={steps}, lr={lr}")
    if X.ndim != 2 or W0.shape != W_target.shape or W0.shape[1] != X.shape[1]:
        raise ValueError(f"X must be N x DIM and W0, W_target out x DIM, got {tuple(X.shape)}, "
                         f"{tuple(W0.shape)}, {tuple(W_target.shape)}")
    X, W0, W_target = (t.detach().cpu().double() for t in (X, W0, W_target))
    out = W0.shape[0]
    H = X.T @ X / X.shape[0]
    eigenvalues, eigenvectors = torch.linalg.eigh(H)
    shrink = (1 - 2 * lr * eigenvalues / out) ** (steps - 1)   # the last loss recorded precedes the last step
    error = W0 - W_target
    final_error = (error @ eigenvectors) * shrink @ eigenvectors.T
    stuck = _first_update_lost(W0, error, H, lr)
    moved = (W_target + final_error).half() != W0.half()
    return FineTuneForecast(fp32_loss=_loss(final_error, H), stuck_share=stuck.double().mean().item(),
                            stuck_loss=_floor_with_stuck(error, H, stuck),
                            master_moved_share=moved.double().mean().item())


def _loss(error: torch.Tensor, H: torch.Tensor) -> float:
    """The mean squared error of a layer that is off by `error`: tr(E H E^T) / out."""
    return (torch.einsum("ij,jk,ik->", error, H, error) / error.shape[0]).item()


def _first_update_lost(W0: torch.Tensor, error: torch.Tensor, H: torch.Tensor, lr: float) -> torch.Tensor:
    """Where the first SGD update of FP16 weights W0 rounds back to W0 (a bool mask)."""
    update = lr * 2 / error.shape[0] * (error @ H)
    start = W0.half()
    return (start.double() - update).half() == start


def _floor_with_stuck(error: torch.Tensor, H: torch.Tensor, stuck: torch.Tensor) -> float:
    """The least loss over the free weights with the stuck ones held at their starting error.

    Row by row the loss is e^T H e / out; fixing e_S and minimising over e_F leaves
    e_S^T (H_SS - H_SF H_FF^-1 H_FS) e_S, the Schur complement of the free block."""
    total = 0.0
    for row, held in zip(error, stuck):
        free = ~held
        e_s = row[held]
        if e_s.numel() == 0:
            continue
        h_ss, h_sf, h_ff = H[held][:, held], H[held][:, free], H[free][:, free]
        schur = h_ss - h_sf @ torch.linalg.solve(h_ff, h_sf.T) if free.any() else h_ss
        total += (e_s @ schur @ e_s).item()
    return total / error.shape[0]
