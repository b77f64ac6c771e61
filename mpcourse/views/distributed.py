"""Multi-process runs side by side: losses, bytes communicated and memory per rank (lesson 08)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpcourse.distributed import DistributedResult


def format_results(results: list[DistributedResult]) -> str:
    """The runs as a plain-text table: final loss, bytes communicated and memory per rank."""
    header = (f"{'run':36}{'ranks':>6}{'final loss':>11}{'gradient B/step':>16}"
              f"{'other B/step':>13}{'params B/rank':>14}{'grads B/rank':>13}")
    lines = [header, "-" * len(header)]
    for r in results:
        other = sum(r.bytes_per_step.values()) - r.gradient_bytes_per_step
        lines.append(f"{r.run.label:36}{r.world_size:>6}{r.losses[-1]:>11.4f}{r.gradient_bytes_per_step:>16,}"
                     f"{other:>13,}{max(r.param_bytes):>14,}{max(r.grad_bytes):>13,}")
    return "\n".join(lines)
