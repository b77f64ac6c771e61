"""Our GradScaler's unscale_ + step + update against torch.amp.GradScaler's, on the CPU.

Ours is written to be read: a Python loop over the gradients, with one inf/NaN check (and one
host sync) per gradient. Torch's groups the gradients by device and dtype and runs one
`_amp_foreach_non_finite_check_and_unscale_` kernel per group, a design made for CUDA, where
kernel launches and syncs are what cost. On a CPU either may win; the script prints what yours
does. Both produce the same bits (tests/test_scaling.py).
"""
import torch

from mpcourse.amp.scaling import GradScaler
from mpcourse.machine.benchmark import compare

SHAPES = [(512, 512)] * 8 + [(512,)] * 8   # 16 tensors, about 2.1 million values


def setup(scaler):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES]
    optimizer = torch.optim.SGD(params, lr=1e-6)
    scaler.scale(torch.ones(()))  # creates the scale, as the first scale(loss) does

    def iteration():
        for p in params:
            p.grad = torch.full_like(p, 1024.0)  # "scaled" gradients, same work for both
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
    return iteration


def main():
    theirs = setup(torch.amp.GradScaler("cpu"))
    ours = setup(GradScaler())
    result = compare(theirs, ours, name_a="torch.amp.GradScaler", name_b="mpcourse.GradScaler",
                     repeats=9)
    print(f"unscale_ + step + update over {len(SHAPES)} gradients "
          f"({sum(torch.Size(s).numel() for s in SHAPES):,} values), including an SGD step:")
    print(result)


if __name__ == "__main__":
    main()
