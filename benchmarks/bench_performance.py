"""The roofline's two predictions for 16 bits, measured on this CPU: FP32 against BF16.

- An element-wise add over 16M elements is memory-bound, so the model predicts BF16 at 0.5 of
  FP32's time, from the bytes alone. Kernels that convert BF16 element by element (no vector
  conversion instructions, e.g. under ATEN_CPU_CAPABILITY=default) land above that.
- A 1024x1024 matmul is compute-bound on a CPU, so its ratio is the ratio of the arithmetic
  rates: at best 0.5 with AVX512-BF16 (two BF16 multiply-adds per 32-bit lane), far above 1
  where BF16 is emulated.

It also prints the bandwidth the FP32 add reached, the CPU's side of the roofline.
"""
import torch

from mpcourse.machine.benchmark import compare
from mpcourse.machine.performance import elementwise_work, matmul_work

N = 1 << 24
MATMUL_N = 1024


def main() -> None:
    torch.manual_seed(0)
    print(f"{torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    x, y = torch.randn(2, N)
    x16, y16 = x.bfloat16(), y.bfloat16()
    add = compare(lambda: x + y, lambda: x16 + y16, name_a="fp32 add", name_b="bf16 add")
    fp32_add, bf16_add = (elementwise_work(N, d, reads=2) for d in (torch.float32, torch.bfloat16))
    print(f"{add}   (bytes predict {bf16_add.bytes_moved / fp32_add.bytes_moved:.2f}x; "
          f"fp32 reached {fp32_add.bytes_moved / add.seconds_a / 1e9:.1f} GB/s)")

    a, b = torch.randn(2, MATMUL_N, MATMUL_N)
    a16, b16 = a.bfloat16(), b.bfloat16()
    mm = compare(lambda: a @ b, lambda: a16 @ b16, name_a="fp32 matmul", name_b="bf16 matmul")
    work = matmul_work(MATMUL_N, MATMUL_N, MATMUL_N, torch.float32)
    print(f"{mm}   (fp32 reached {work.flops / mm.seconds_a / 1e9:.0f} GFLOP/s, "
          f"bf16 {work.flops / mm.seconds_b / 1e9:.0f} GFLOP/s)")


if __name__ == "__main__":
    main()
