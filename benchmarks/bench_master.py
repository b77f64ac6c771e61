"""MasterWeightOptimizer(AdamW) step against torch's AdamW step on FP32 parameters of the same size.

Both run the same AdamW update on FP32 tensors; the master-weight step also rounds every
master into its 16-bit working copy. The FP16 -> FP32 gradient copy happens during backward
(see mpcourse.amp.master) and is timed separately below, so nothing is hidden.
"""
import torch

from mpcourse.amp.master import MasterWeightOptimizer
from mpcourse.machine.benchmark import compare, measure

SHAPES = [(1024, 1024)] * 4 + [(1024,)] * 4   # about 4.2 million parameters


def parameters(dtype):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape).to(dtype)) for shape in SHAPES]


def main():
    fp32 = parameters(torch.float32)
    for p in fp32:
        p.grad = torch.randn_like(p) * 1e-3
    baseline = torch.optim.AdamW(fp32, lr=1e-4)

    working = parameters(torch.float16)
    ours = MasterWeightOptimizer(working, torch.optim.AdamW, lr=1e-4)
    sum((p.float() * 1e-3).sum() for p in working).backward()  # fills the master gradients

    result = compare(baseline.step, ours.step, name_a="torch AdamW on FP32 params",
                     name_b="MasterWeightOptimizer(AdamW) on FP16 params", repeats=9)
    n = sum(p.numel() for p in fp32)
    print(f"{n:,} parameters")
    print(result)
    print(f"ratio {result.ratio:.2f}x (target: at most 1.2x, issue 17)")

    masters = ours.master_parameters()
    copy_grads = lambda: [m.grad.copy_(w.grad) for w, m in zip(working, masters)]  # noqa: E731
    seconds = sorted(measure(copy_grads, warmup=2, repeats=9))[4]
    print(f"the FP16 -> FP32 gradient copy done during backward: {seconds * 1e3:.3f} ms "
          f"({seconds / result.seconds_a:.2f}x of an AdamW step)")


if __name__ == "__main__":
    main()
