"""Fp8Linear against nn.Linear: forward and backward of one layer, FP8 emulated vs FP32.

On a CPU the FP8 layer is emulated: it rounds the input, the weight and the output gradient
to FP8 with integer bit operations (`formats.round_to`) and then multiplies in FP32, so it can
only be slower than the plain FP32 layer. The numbers say how much the emulation costs, which
is what a learner waits for in lesson 07; the speed of real FP8 needs an FP8 GPU.
"""
import torch
from torch import nn

from mpcourse.machine.benchmark import compare
from mpcourse.lowbit.fp8 import Fp8Linear

SHAPES = [(256, 32, 96), (2048, 256, 1024)]   # (tokens, in_features, out_features)


def step(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor):
    return lambda: layer(x).backward(grad)


def main() -> None:
    torch.manual_seed(0)
    print(f"forward + backward of one linear layer, {torch.get_num_threads()} threads")
    for tokens, d_in, d_out in SHAPES:
        fp32 = nn.Linear(d_in, d_out)
        fp8 = Fp8Linear(d_in, d_out)
        x = torch.randn(tokens, d_in, requires_grad=True)
        grad = torch.randn(tokens, d_out)
        result = compare(step(fp32, x, grad), step(fp8, x, grad),
                         name_a=f"nn.Linear fp32 {tokens}x{d_in}->{d_out}", name_b="Fp8Linear (emulated)")
        print(result)


if __name__ == "__main__":
    main()
